"""Two targets of one run compared as two runs are (report/diff.py): target A is "then"
and target B "now", so that a case that passes on A and fails on B is newly failing
(a regression), one that fails on A and passes on B is fixed, one played against B
only is new and one against A only removed. A case whose repetitions on B disagree is
flaky. Both targets played the same definition of every case, so none is "changed";
the suite's history is not consulted: the comparison is within the run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agenttest_worker.report.causes import flake_cause
from agenttest_worker.report.diff import CaseChange, RunDiff, RunInfo, category, difference
from agenttest_worker.report.verdicts import CaseVerdict, case_verdict, grouped
from agenttest_worker.results import CaseResult


@dataclass(frozen=True)
class _Played:
    verdict: CaseVerdict
    records: list[CaseResult]


def played_targets(records: Iterable[CaseResult]) -> list[str]:
    """The targets a run's records played, in the order they were first played."""
    return list(dict.fromkeys(r.agent or "" for r in records))


def target_diff(
    run: RunInfo, records: Iterable[CaseResult], then: str, now: str, rule: str = "all"
) -> RunDiff:
    """What changes from target `then` to target `now` over one run's `records`, case
    by case, each case's verdict under the run's pass `rule`."""
    by_target: dict[str, dict[str, _Played]] = {then: {}, now: {}}
    order: dict[str, None] = {}
    for group in grouped(records):
        played = by_target.get(group[0].agent or "")
        if played is not None:
            played[group[0].id] = _Played(case_verdict(group, rule), group)
            order[group[0].id] = None
    found = RunDiff(run, run, window=1, targets=(then, now))
    for case_id in order:
        was, is_now = by_target[then].get(case_id), by_target[now].get(case_id)
        base = was.verdict.status if was else None
        new = is_now.verdict.status if is_now else None
        change = CaseChange(case_id, category(base, new), base, new)
        either = is_now or was
        change.name = either.verdict.name if either is not None else None
        found.changes.append(change)
        if is_now is None:
            continue
        verdict = is_now.verdict
        if change.category not in ("new", "removed") and verdict.flaky:
            change.category = "flaky"
            change.flaky_because = f"its repetitions on {now} disagree: {verdict.fraction()} passed"
        later = is_now.records
        failing = next((r for r in later if r.status == "failed"), later[0])
        if failing.status != "passed":
            change.cause = flake_cause(failing, any(r.status == "passed" for r in later))
        if change.category == "regression" and was is not None:
            passing = next((r for r in was.records if r.status == "passed"), None)
            if passing is not None:
                change.difference = difference(passing, failing)
    return found
