"""The diff of two runs of a suite, built from the store (report/diff.py has the
categories), with the noise-aware gate's weighing of pass rates when asked for: each
case's passes then (the baseline's repetitions, or its plays pooled over the suite's
last runs, `--history-window N`) and now, tested for a significant drop
(report/significance.py) at `--confidence`.

A diff reads each run as one row per case (store/sql/run_history.py) and the records only
of the cases it explains (regressions, likely regressions, changed cases that fail).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agenttest_submit.run.runner import resolve_run
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import (
    DEFAULT_CONFIDENCE,
    FLAKES,
    CaseChange,
    Definitions,
    PassRates,
    RunDiff,
    RunInfo,
    audited_cause,
    category,
    counted,
    difference,
    gated_category,
    in_order,
    read_cause,
    tally_verdict,
)
from agenttest_worker.results import CaseResult, CaseStatus
from agenttest_worker.store import run_history as history
from agenttest_worker.store import unstable_criteria

if TYPE_CHECKING:
    from agenttest_worker.store import RunRow

DEFAULT_WINDOW = 10


@dataclass(frozen=True)
class Weighing:
    """The noise-aware gate: its `confidence` (e.g. 0.95), and `history_window`: how
    many of the suite's finished runs before the new one are pooled as the baseline
    (None: the baseline run alone)."""

    confidence: float
    history_window: int | None = None


def weighing_of(confidence: float | None, history_window: int | None) -> Weighing | None:
    """The noise-aware gate `--confidence` and `--history-window` ask for (either turns
    it on; the confidence is 0.95 unless given), or None: verdicts compared as they are."""
    if confidence is None and history_window is None:
        return None
    return Weighing(DEFAULT_CONFIDENCE if confidence is None else confidence, history_window)


@dataclass(frozen=True)
class Tallies:
    """Each case's tally in the baseline run and in the new run, and the new run."""

    then: dict[str, history.CaseTally]
    now: dict[str, history.CaseTally]
    new: RunRow


def weigh(url: str, found: RunDiff, tallies: Tallies, weighing: Weighing) -> None:
    """Each compared case's pass rates then and now, and its category once they are
    weighed (report/significance.py `gated_category`)."""
    found.confidence, found.history_window = weighing.confidence, weighing.history_window
    pooled: dict[str, dict[str | None, history.Pooled]] = {}
    if weighing.history_window and tallies.new.suite is not None:
        runs = history.suite_runs(
            url,
            tallies.new.suite,
            finished=True,
            before=tallies.new.created_at,
            last=weighing.history_window,
        )
        pooled = history.pooled_tallies(url, [r.id for r in runs])
    for change in found.changes:
        now = tallies.now.get(change.id)
        if now is None or change.category in ("new", "removed", "changed"):
            continue
        then = _then(change, tallies.then.get(change.id), pooled.get(change.id))
        # (Skipped plays count on neither side: a side of only skips is not compared.)
        if then is None or then.passed + then.failed == 0 or now.passed + now.failed == 0:
            continue
        change.rates = PassRates(
            then.passed,
            then.passed + then.failed,
            now.passed,
            now.passed + now.failed,
            weighing.confidence,
            runs_then=then.runs,
        )
        change.category = gated_category(change.category, change.new, change.rates)


def _then(
    change: CaseChange,
    base: history.CaseTally | None,
    pooled: dict[str | None, history.Pooled] | None,
) -> history.Pooled | None:
    """The case's plays then: pooled over the history window under its definition now
    (every definition when unknown), else the baseline run's."""
    if pooled is not None:
        if change.new_definition is not None:
            mine = [pooled[d] for d in (change.new_definition, None) if d in pooled]
        else:
            mine = list(pooled.values())
        if mine:
            return history.Pooled(
                sum(p.passed for p in mine), sum(p.failed for p in mine), sum(p.runs for p in mine)
            )
    if base is None:
        return None
    return history.Pooled(base.passed, base.failed, 1)


def _info(run: RunRow) -> RunInfo:
    return RunInfo(run.id, run.created_at, run.suite, run.status)


def stored_pass_rule(run: RunRow) -> str:
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


def build_diff(
    url: str,
    base: RunRow,
    new: RunRow,
    window: int = DEFAULT_WINDOW,
    weighing: Weighing | None = None,
) -> RunDiff:
    """What changed from `base` to `new`, case by case (report/diff.py); with
    `weighing`, each case's pass rates are weighed (report/significance.py)."""
    base_rule, rule = stored_pass_rule(base), stored_pass_rule(new)
    then_tallies = {t.id: t for t in history.case_tallies(url, base.id)}
    before: dict[str, tuple[CaseStatus, str | None]] = {
        t.id: (tally_verdict(t.played, t.passed, t.skipped, base_rule), t.definition)
        for t in then_tallies.values()
    }
    found = RunDiff(_info(base), _info(new), window)
    # Read once per run: the criteria the new run's newest audit of its judges found
    # unstable, which make failures resting on them the judge's (report/causes.py).
    unstable = frozenset(u.criterion for u in unstable_criteria(url, new.id))
    found.causes = in_order(history.failing_causes(url, new.id, _judged(unstable)))
    disagreeing: dict[str, str] = {}
    now_tallies: dict[str, history.CaseTally] = {}
    for tally in history.case_tallies(url, new.id):
        now_tallies[tally.id] = tally
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
    if weighing is not None:
        weigh(url, found, Tallies(then_tallies, now_tallies, new), weighing)
    failing_changed = [c for c in found.of("changed") if c.new == "failed"]
    explained = [*found.regressions, *found.of("likely_regression"), *failing_changed]
    _explain_regressions(url, (base, new), explained, unstable)
    if found.history_window:
        for change in found.of("likely_regression"):
            # It failed now but passed in the history window, and not significantly less
            # often: the target's failure is a flake (report/causes.py).
            passed_before = change.rates is not None and change.rates.then_passed > 0
            if change.cause in FLAKES and passed_before:
                change.cause = "flake"
    return found


def _window(url: str, new: RunRow, window: int) -> list[RunRow]:
    """The suite's last `window` finished runs up to `new` (itself included)."""
    earlier = history.suite_runs(url, new.suite, finished=True, before=new.created_at)
    return [new, *earlier[: max(window - 1, 0)]] if new.suite is not None else [new]


def _judged(unstable: frozenset[str]) -> Callable[[str], bool] | None:
    """Whether a stored failed record's failure is the judge's, given the unstable
    criteria (None: no audit found any)."""
    if not unstable:
        return None
    return lambda text: audited_cause(CaseResult.model_validate_json(text), unstable) == "judge"


def _explain_regressions(
    url: str, runs: tuple[RunRow, RunRow], changes: list[CaseChange], unstable: frozenset[str]
) -> None:
    """Each regression's first difference: its records read a chunk of cases at a time.
    Its cause is the failing record's as a report reads it (report/causes.py)."""
    base, new = runs
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
            repeated_pass = len(later) > 1 and any(r.status == "passed" for r in later)
            change.cause = (
                read_cause(failing, repeated_pass, unstable) if failing.status != "passed" else None
            )
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
