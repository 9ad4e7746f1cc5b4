"""A run of several targets (`-n A -n B`) as its reports show it: each case once, with
one verdict per target.

Such a run plays every case against each target, a conversation (and its repetitions)
of its own per target, stored one target after the other; each case × target has its
own verdict (`verdicts.grouped` splits a case's records by target). These are the
reports' views of them: the groups of one case together (`by_case`) and the verdicts
of each case by target (`target_rows`), None for a run of one target, whose reports
stay as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.report.diff import category
from agenttest_worker.report.verdicts import CaseVerdict
from agenttest_worker.results import CaseResult


def by_case(groups: Iterable[list[CaseResult]]) -> Iterator[list[list[CaseResult]]]:
    """`verdicts.grouped`'s groups, those of one case (one per target) together."""
    found: list[list[CaseResult]] = []
    for group in groups:
        if found and group[0].id != found[0][0].id:
            yield found
            found = []
        found.append(group)
    if found:
        yield found


@dataclass
class TargetRow:
    """One case of a run of several targets: its verdict on each, in the run's order."""

    id: str
    name: str | None
    verdicts: dict[str, CaseVerdict] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """`{id, name, targets: {A: {status, passed, repeats, flaky}, ...}}`."""
        targets = {}
        for target, found in self.verdicts.items():
            targets[target] = {k: v for k, v in found.as_dict().items() if k not in ("id", "name")}
        return {"id": self.id, "name": self.name, "targets": targets}


def target_rows(verdicts: Iterable[CaseVerdict]) -> list[TargetRow] | None:
    """Each case's verdicts by target, in the run's order; None when no case was played
    against more than one target."""
    rows: dict[str, TargetRow] = {}
    for found in verdicts:
        row = rows.setdefault(found.id, TargetRow(found.id, found.name))
        row.verdicts[found.agent or ""] = found
    if not any(len(row.verdicts) > 1 for row in rows.values()):
        return None
    return list(rows.values())


def targets_of(rows: Iterable[TargetRow]) -> list[str]:
    """The targets the rows name, in the order they were first played."""
    return list(dict.fromkeys(target for row in rows for target in row.verdicts))


def target_counts(rows: Iterable[TargetRow]) -> dict[str, dict[str, int]]:
    """Per target, its cases passed, failed and skipped."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        for target, found in row.verdicts.items():
            tally = counts.setdefault(target, {"passed": 0, "failed": 0, "skipped": 0})
            tally[found.status] += 1
    return counts


def against_first(rows: list[TargetRow]) -> dict[str, tuple[list[str], list[str]]]:
    """Each later target against the first, as `diff RUN --targets FIRST T` sorts
    verdicts (report/target_comparison.py, before flakiness): the ids newly failing on
    it and the ids fixed on it."""
    targets = targets_of(rows)
    found: dict[str, tuple[list[str], list[str]]] = {}
    for target in targets[1:]:
        failing: list[str] = []
        fixed: list[str] = []
        for row in rows:
            then, now = row.verdicts.get(targets[0]), row.verdicts.get(target)
            kind = category(then.status if then else None, now.status if now else None)
            if kind == "regression":
                failing.append(row.id)
            elif kind == "fixed":
                fixed.append(row.id)
        found[target] = (failing, fixed)
    return found
