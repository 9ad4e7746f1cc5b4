"""Run history commands: `diff [BASE] [NEW]`, `history CASE_ID`, `runs`, and the diff a
run prints at its end (`--baseline`, `--fail-on regressions`).

A diff is built by run_diffs.py; history reads one case's records over a suite's runs.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agenttest_submit.cli.output_file import output_problem, written_to
from agenttest_submit.cli.request import (
    DiffRequest,
    HistoryCommandRequest,
    HistoryRequest,
    PromoteRequest,
    RunsRequest,
)
from agenttest_submit.commands.run_diffs import (
    Weighing,
    build_diff,
    previous_run,
    resolve_baseline,
    stored_pass_rule,
    weighing_of,
)
from agenttest_submit.run.runner import resolve_run
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import (
    CaseChange,
    RunDiff,
    RunInfo,
    case_count,
    case_verdict,
    counted,
    format_ms,
    one_line,
    played_targets,
    printable,
    render_diff,
    target_diff,
)
from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings
from agenttest_worker.store import results as stored_results
from agenttest_worker.store import run_history as history
from agenttest_worker.store import runs as stored_runs
from agenttest_worker.store import upgrade
from agenttest_worker.store import usage as stored_usage

if TYPE_CHECKING:
    from agenttest_worker.store import RunRow

DEFAULT_LAST = 20


# -- the commands ----------------------------------------------------------------------


def run_history_command(request: HistoryCommandRequest) -> int:
    """`diff`, `history`, `runs` or `promote`, against the store this environment points at."""
    url = get_settings().effective_database_url()
    if isinstance(request, PromoteRequest):
        upgrade(url)
        return run_promote(url, request)
    if problem := output_problem(request.output):
        raise InputError(problem)
    upgrade(url)
    with written_to(request.output):
        if isinstance(request, DiffRequest):
            return run_diff(url, request)
        if isinstance(request, HistoryRequest):
            return run_history(url, request)
        return run_list(url, request)


def run_promote(url: str, request: PromoteRequest) -> int:
    """`promote RUN`: the run becomes its suite's baseline (`--baseline suite`,
    `--baseline suite:NAME`) until another run of the suite is promoted."""
    run = resolve_run(url, request.run)
    if run.status != "done":
        raise InputError(
            InputProblem(
                f"run {run.id} has not finished (status {run.status}): only a finished run "
                "can be a baseline",
                field="RUN",
            )
        )
    if run.suite is None:
        raise InputError(InputProblem(f"run {run.id} belongs to no suite", field="RUN"))
    stored_runs.promote_run(url, run.id)
    print(f"run {printable(run.id)} is the baseline of suite {printable(run.suite)}")
    return 0


def run_diff(url: str, request: DiffRequest) -> int:
    """`diff [BASE] [NEW]`: exit 1 when a case passed in BASE and fails in NEW."""
    new = resolve_run(url, request.new)
    if request.targets is not None:
        found = _targets_diff(url, new, request.targets)
        sys.stdout.write(render_diff(found, request.format))
        return 1 if found.regressions else 0
    base = resolve_baseline(url, request.base, new) if request.base else previous_run(url, new)
    if base is None:
        raise InputError(
            InputProblem(
                f"run {new.id} (suite {new.suite!r}) has no earlier finished run to compare "
                "with: give BASE",
                field="BASE",
            )
        )
    weighing = weighing_of(request.confidence, request.history_window)
    found = build_diff(url, base, new, request.window, weighing)
    if request.format == "junit":
        place(url, new, found)
    sys.stdout.write(render_diff(found, request.format))
    return 1 if found.regressions else 0


def _targets_diff(url: str, run: RunRow, targets: tuple[str, ...]) -> RunDiff:
    """`diff RUN --targets A B`: the run's target B against its target A."""
    then, now = targets
    played = played_targets(stored_results.iter_results(url, run.id))
    missing = [t for t in (then, now) if t not in played]
    if missing:
        raise InputError(
            InputProblem(
                f"run {run.id} played no target {', '.join(map(repr, missing))}; it played "
                + ", ".join(played or ["nothing yet"]),
                field="--targets",
            )
        )
    info = RunInfo(run.id, run.created_at, run.suite, run.status)
    records = stored_results.iter_results(url, run.id)
    return target_diff(info, records, then, now, stored_pass_rule(run))


def place(url: str, new: RunRow, found: RunDiff) -> None:
    """Each case's time in `new`, its file and line: what a JUnit testcase carries."""
    places = history.case_places(url, new.id)
    for change in found.changes:
        where = places.get(change.id)
        if where is not None:
            change.duration_ms, change.file, change.line = (
                where.duration_ms,
                where.file,
                where.line,
            )


@dataclass(frozen=True)
class Gate:
    """What a run's end compares and decides: `baseline` (--baseline), `fail_on`
    (--fail-on: ("any",), or "regressions" and/or "new"), the run's own exit `code`, and
    why the run stopped before every case was tested (None: it did not)."""

    baseline: str
    fail_on: tuple[str, ...]
    code: int
    stopped: str | None = None
    # The noise-aware gate (--confidence, --history-window); None: verdicts compared.
    weighing: Weighing | None = None


def gate_failures(found: RunDiff, fail_on: tuple[str, ...]) -> list[CaseChange]:
    """The cases that fail the job under `fail_on`: regressions, and new cases (or
    changed ones: a definition the baseline never played) that fail."""
    failing: list[CaseChange] = []
    if "regressions" in fail_on:
        failing += found.regressions
    if "new" in fail_on:
        failing += [
            c for c in found.changes if c.category in ("new", "changed") and c.new == "failed"
        ]
    return failing


def print_baseline_diff(url: str, run_id: str, gate: Gate) -> tuple[int, RunDiff | None]:
    """After a run's report: its diff against the baseline, and the exit code
    `--fail-on` asks for (`regressions`: 1 for cases that passed in the baseline and
    fail now; `new`: for new or changed cases that fail; `any`: the run's own code). A
    run stopped before every case was tested exits 1 whatever the diff says. Returns the
    code and the diff (None: no baseline to compare with)."""
    new = resolve_run(url, run_id)
    gating = gate.fail_on != ("any",)
    if gate.stopped and gating:
        print(
            f"--fail-on {','.join(gate.fail_on)}: the run stopped before every case was "
            f"tested ({printable(gate.stopped)}): exit 1",
            file=sys.stderr,
        )
    try:
        base = resolve_baseline(url, gate.baseline, new)
    except InputError as exc:
        why = printable(str(exc.problems[0]))
        flag = f"--fail-on {','.join(gate.fail_on)}" if gating else f"--baseline {gate.baseline}"
        print(
            f"warning: {flag}: no baseline to compare with ({why}); the run's own exit code stands",
            file=sys.stderr,
        )
        return _gated(url, run_id, gating, gate.code), None
    found = build_diff(url, base, new, weighing=gate.weighing)
    sys.stdout.write("\n" + render_diff(found, "console"))
    if likely := found.of("likely_regression"):
        print(
            f"note: {counted(len(likely), 'case')} likely regressed: its verdict fell, but "
            "not significantly; it does not fail the job: repeat it (--repeat) to know",
            file=sys.stderr,
        )
    if not gating:
        return gate.code, found
    if gate.stopped:
        return _gated(url, run_id, gating, 1), found
    failing = gate_failures(found, gate.fail_on)
    if "new" not in gate.fail_on:
        unguarded = gate_failures(found, ("new",))
        if unguarded:
            print(
                f"note: {counted(len(unguarded), 'new or changed case')} "
                f"{'fails' if len(unguarded) == 1 else 'fail'} and "
                f"{'does' if len(unguarded) == 1 else 'do'} not fail the job "
                "(--fail-on regressions,new would)",
                file=sys.stderr,
            )
    return _gated(url, run_id, gating, 1 if failing else 0), found


def _gated(url: str, run_id: str, gating: bool, code: int) -> int:
    """`code`, kept with a gated run: one that failed is never a baseline."""
    if gating:
        stored_runs.record_gate(url, run_id, passed=code == 0)
    return code


def run_history(url: str, request: HistoryRequest) -> int:
    """`history CASE_ID`: the case's verdict run after run, and how often it changed."""
    suite = request.suite
    runs = history.case_runs(url, request.case_id, suite, request.last)
    if not runs:
        where = f" in suite {suite!r}" if suite else ""
        raise InputError(
            InputProblem(f"no finished run{where} played case {request.case_id!r}", field="CASE_ID")
        )
    rows = [_history_row(found) for found in runs]
    oldest_first = list(reversed(runs))
    for older, newer, row in zip(oldest_first, oldest_first[1:], reversed(rows[:-1]), strict=False):
        row["changed"] = _redefined(older.definition, newer.definition)
    rows[-1]["changed"] = False
    tally = flake_tally([(row["status"], row["changed"]) for row in reversed(rows)])
    if request.format == "json":
        document = {
            "case_id": request.case_id,
            "suite": suite,
            "runs": rows,
            "changes": tally.changes,
            "flips": tally.flips,
            "flake_rate": round(tally.rate, 4),
        }
        sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        return 0
    lines = [
        f"History of {printable(request.case_id)}"
        + (f" in suite {printable(suite)}" if suite else "")
        + f": {counted(len(rows), 'run')}, flake rate {tally.rate:.0%} "
        f"({counted(tally.flips, 'flip')} in {counted(tally.windows, 'window')} of three runs; "
        f"{counted(tally.changes, 'change')})",
        "",
        f"{'RUN':<24}  {'DATE':<16}  {'STATUS':<8}  {'REPEATS':>7}  {'DURATION':>8}  REASON",
    ]
    for row in rows:
        reason = one_line(row["reason"] or "")
        if row["changed"]:
            reason = f"(definition changed) {reason}".rstrip()
        lines.append(
            f"{printable(row['run_id']):<24}  {row['created_at'][:16].replace('T', ' '):<16}  "
            f"{row['status'].upper():<8}  {row['repeats']:>7}  "
            f"{format_ms(row['duration_ms']):>8}  {reason}"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _redefined(older: str | None, newer: str | None) -> bool:
    """Whether the case's definition changed between two runs (unknown: it did not)."""
    return older is not None and newer is not None and older != newer


@dataclass(frozen=True)
class FlakeTally:
    """How a case's verdict moved over its runs: `changes` from one run to the next
    (under the same definition), and `flips` out of `windows`: runs whose verdict
    differs from both neighbours', all three of one definition."""

    changes: int
    flips: int
    windows: int

    @property
    def rate(self) -> float:
        return self.flips / self.windows if self.windows else 0.0


def flake_tally(verdicts: list[tuple[str, bool]]) -> FlakeTally:
    """The tally of (verdict, definition changed since the run before) oldest first.

    A flip is a verdict that went and came back (passed, failed, passed): one
    regression (passed, passed, failed) is a change, not flakiness, and a case whose
    definition changed starts a new history."""
    changes = sum(
        1 for (a, _), (b, changed) in itertools.pairwise(verdicts) if a != b and not changed
    )
    flips = windows = 0
    for (before, _), (verdict, changed), (after, changed_after) in zip(
        verdicts, verdicts[1:], verdicts[2:], strict=False
    ):
        if changed or changed_after:
            continue
        windows += 1
        flips += before != verdict != after
    return FlakeTally(changes, flips, windows)


def _history_row(played: history.CaseInRun) -> dict[str, Any]:
    run = played.run
    records = [CaseResult.model_validate_json(t) for t in played.records]
    found = case_verdict(records, stored_pass_rule(run))
    failing = next((r for r in records if r.status == "failed"), None)
    return {
        "run_id": run.id,
        "suite": run.suite,
        "created_at": _iso(run.created_at),
        "status": found.status,
        "repeats": found.fraction() if found.repeated else "",
        "duration_ms": sum(r.duration_ms for r in records),
        # The judge's (or any failing assertion's) reason, where it failed.
        "reason": _reason(failing) if failing else None,
    }


def _reason(record: CaseResult) -> str:
    checked = [a for t in record.turns for a in t.assertions] + list(record.final_assertions)
    failed = [a for a in checked if not a.passed]
    judged = next((a for a in failed if a.type == "agent"), None)
    chosen = judged or (failed[0] if failed else None)
    if chosen is not None:
        return chosen.reason or chosen.error or "failed"
    return record.error or "failed"


def _iso(when: datetime | None) -> str:
    return when.isoformat() if when else ""


def run_list(url: str, request: RunsRequest) -> int:
    """`runs`: the suite's (or every) run, newest first, with their counts."""
    runs = history.suite_runs(url, request.suite, last=request.last)
    rows: list[dict[str, Any]] = [
        {
            "run_id": run.id,
            "suite": run.suite,
            # Its target, or targets ("A, B": -n given more than once).
            "agent": run.agent,
            "created_at": _iso(run.created_at),
            "status": run.status,
            "cases": (run.options or {}).get("distinct_cases") or run.total_cases,
            # --repeat auto: the conversations played (its total counts chains of them).
            "conversations": run.passed + run.failed + run.skipped
            if (run.options or {}).get("repeat_auto")
            else run.total_cases,
            "repeat_auto": bool((run.options or {}).get("repeat_auto")),
            "passed": run.passed,
            "failed": run.failed,
            "skipped": run.skipped,
            "cost": stored_usage.run_cost(run.total_cost, run.usage),
        }
        for run in runs
    ]
    if request.format == "json":
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return 0
    if not rows:
        print("no runs yet" + (f" in suite {printable(request.suite)}" if request.suite else ""))
        return 0
    lines = [
        f"{'RUN':<24}  {'DATE':<16}  {'STATUS':<11}  {'CASES':>7}  PASSED  FAILED  SKIPPED"
        f"  {'COST':>9}  SUITE"
    ]
    for row in rows:
        cases = case_count(row["cases"], row["conversations"])
        if row["repeat_auto"]:  # as many repetitions as each case needed: never "4×5"
            cases = f"{row['cases']} ({counted(row['conversations'], 'conversation')})"
        lines.append(
            f"{printable(row['run_id']):<24}  {row['created_at'][:16].replace('T', ' '):<16}  "
            f"{row['status']:<11}  {cases:>7}  {row['passed']:>6}  {row['failed']:>6}  "
            f"{row['skipped']:>7}  {row['cost']:>9.4f}  {printable(row['suite'] or '-')}"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
