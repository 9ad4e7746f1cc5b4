"""Run history commands: `diff [BASE] [NEW]`, `history CASE_ID`, `runs`, and the diff a
run prints at its end (`--baseline`, `--fail-on regressions`).

A diff reads each run as one row per case (store/sql/run_history.py) and the records only of
the regressions, whose first difference it shows; history reads one case's records
over a suite's runs.
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
from agenttest_submit.run.runner import resolve_run
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import (
    CaseChange,
    Definitions,
    RunDiff,
    RunInfo,
    case_count,
    case_verdict,
    category,
    counted,
    difference,
    format_ms,
    one_line,
    printable,
    render_diff,
    tally_verdict,
)
from agenttest_worker.results import CaseResult, CaseStatus
from agenttest_worker.settings import get_settings
from agenttest_worker.store import run_history as history
from agenttest_worker.store import runs as stored_runs
from agenttest_worker.store import upgrade

if TYPE_CHECKING:
    from agenttest_worker.store import RunRow

DEFAULT_WINDOW = 10
DEFAULT_LAST = 20


def _info(run: RunRow) -> RunInfo:
    return RunInfo(run.id, run.created_at, run.suite, run.status)


def _rule(run: RunRow) -> str:
    return str((run.options or {}).get("pass_rule") or "all")


def previous_run(url: str, run: RunRow) -> RunRow | None:
    """The finished run of `run`'s suite before it, or None."""
    if run.suite is None:
        return None
    before = [r for r in history.suite_runs(url, run.suite, finished=True, before=run.created_at)]
    return before[0] if before else None


SUITE_PREFIX = "suite:"


def resolve_baseline(url: str, ref: str, new: RunRow) -> RunRow:
    """A baseline: a run id, `last` (the newest run before `new`), `suite` (the
    baseline of `new`'s suite: its promoted run, else its newest finished run before
    `new` that did not fail its gate), or `suite:NAME` (the baseline of suite NAME, as
    it was when `new` was created: e.g. the nightly run of the main branch)."""
    if ref == "suite" or ref.startswith(SUITE_PREFIX):
        suite = new.suite if ref == "suite" else ref.removeprefix(SUITE_PREFIX)
        found = history.suite_baseline(url, suite, new.created_at) if suite else None
        if found is None:
            raise InputError(
                InputProblem(
                    f"suite {suite!r} has no promoted run and no finished run before "
                    f"{new.id} that did not fail its gate",
                    field="--baseline",
                )
            )
        return found
    if ref == "last":
        earlier = history.suite_runs(url, None, last=1, before=new.created_at)
        if not earlier:
            raise InputError(InputProblem(f"no run before {new.id}", field="--baseline"))
        return earlier[0]
    return resolve_run(url, ref)


def build_diff(url: str, base: RunRow, new: RunRow, window: int = DEFAULT_WINDOW) -> RunDiff:
    """What changed from `base` to `new`, case by case (report/diff.py)."""
    base_rule, rule = _rule(base), _rule(new)
    before: dict[str, tuple[CaseStatus, str | None]] = {
        t.id: (tally_verdict(t.played, t.passed, t.skipped, base_rule), t.definition)
        for t in history.case_tallies(url, base.id)
    }
    found = RunDiff(_info(base), _info(new), window)
    disagreeing: dict[str, str] = {}
    for tally in history.case_tallies(url, new.id):
        now = tally_verdict(tally.played, tally.passed, tally.skipped, rule)
        was, was_defined = before.pop(tally.id, (None, None))
        change = CaseChange(tally.id, category(was, now), was, now)
        change.base_definition, change.new_definition = was_defined, tally.definition
        found.changes.append(change)
        if tally.played > 1 and tally.passed not in (0, tally.played):
            disagreeing[tally.id] = (
                f"its repetitions disagree: {tally.passed}/{tally.played} passed"
            )
    for case_id, (was, was_defined) in before.items():
        found.changes.append(CaseChange(case_id, "removed", was, None))
        found.changes[-1].base_definition = was_defined
    runs = _window(url, new, window)
    changing = history.changing_cases(url, [r.id for r in runs], rule)
    for change in found.changes:
        if change.category in ("new", "removed"):
            continue
        if None not in (change.base_definition, change.new_definition) and (
            change.base_definition != change.new_definition
        ):
            # Another case under the same id: its verdicts are not compared.
            change.category = "changed"
        elif change.id in changing:
            change.category = "flaky"
            change.flaky_because = (
                f"its verdict changed at least twice in the last {counted(len(runs), 'run')}"
            )
        elif change.id in disagreeing:
            change.category = "flaky"
            change.flaky_because = disagreeing[change.id]
    failing_changed = [c for c in found.of("changed") if c.new == "failed"]
    _explain_regressions(url, base, new, found.regressions + failing_changed)
    return found


def _window(url: str, new: RunRow, window: int) -> list[RunRow]:
    """The suite's last `window` finished runs up to `new` (itself included)."""
    earlier = history.suite_runs(url, new.suite, finished=True, before=new.created_at)
    return [new, *earlier[: max(window - 1, 0)]] if new.suite is not None else [new]


def _explain_regressions(url: str, base: RunRow, new: RunRow, changes: list[CaseChange]) -> None:
    """Each regression's first difference: its records read a chunk of cases at a time."""
    for start in range(0, len(changes), history.CHUNK):
        chunk = {c.id: c for c in changes[start : start + history.CHUNK]}
        then = _records(url, base.id, chunk)
        now = _records(url, new.id, chunk)
        defined_then = history.definitions_of(url, base.id, chunk)
        defined_now = history.definitions_of(url, new.id, chunk)
        for case_id, change in chunk.items():
            earlier, later = then.get(case_id, []), now.get(case_id, [])
            if not later:
                continue
            change.name = later[0].name
            failing = next((r for r in later if r.status == "failed"), later[0])
            passing = next((r for r in earlier if r.status == "passed"), None)
            defined, defining = defined_then.get(case_id), defined_now.get(case_id)
            definitions = Definitions(defined, defining) if defined and defining else None
            if passing is not None:
                change.difference = difference(passing, failing, definitions)


def _records(url: str, run_id: str, ids: dict[str, Any]) -> dict[str, list[CaseResult]]:
    found: dict[str, list[CaseResult]] = {}
    for case_id, text in history.results_of(url, run_id, ids):
        found.setdefault(case_id, []).append(CaseResult.model_validate_json(text))
    return found


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
    base = resolve_baseline(url, request.base, new) if request.base else previous_run(url, new)
    if base is None:
        raise InputError(
            InputProblem(
                f"run {new.id} (suite {new.suite!r}) has no earlier finished run to compare "
                "with: give BASE",
                field="BASE",
            )
        )
    found = build_diff(url, base, new, request.window)
    if request.format == "junit":
        place(url, new, found)
    sys.stdout.write(render_diff(found, request.format))
    return 1 if found.regressions else 0


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


def print_baseline_diff(url: str, run_id: str, gate: Gate) -> int:
    """After a run's report: its diff against the baseline, and the exit code
    `--fail-on` asks for (`regressions`: 1 for cases that passed in the baseline and
    fail now; `new`: for new or changed cases that fail; `any`: the run's own code). A
    run stopped before every case was tested exits 1 whatever the diff says."""
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
        return _gated(url, run_id, gating, gate.code)
    found = build_diff(url, base, new)
    sys.stdout.write("\n" + render_diff(found, "console"))
    if not gating:
        return gate.code
    if gate.stopped:
        return _gated(url, run_id, gating, 1)
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
    return _gated(url, run_id, gating, 1 if failing else 0)


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
    found = case_verdict(records, _rule(run))
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
        f"{'RUN':<24}  {'DATE':<16}  {'STATUS':<11}  {'CASES':>7}  PASSED  FAILED  SKIPPED  SUITE"
    ]
    for row in rows:
        cases = case_count(row["cases"], row["conversations"])
        if row["repeat_auto"]:  # as many repetitions as each case needed: never "4×5"
            cases = f"{row['cases']} ({counted(row['conversations'], 'conversation')})"
        lines.append(
            f"{printable(row['run_id']):<24}  {row['created_at'][:16].replace('T', ' '):<16}  "
            f"{row['status']:<11}  {cases:>7}  {row['passed']:>6}  {row['failed']:>6}  "
            f"{row['skipped']:>7}  {printable(row['suite'] or '-')}"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
