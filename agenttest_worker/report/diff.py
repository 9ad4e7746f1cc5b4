"""What changed between two runs of a suite, case by case.

Each case id falls in one category, from its verdict in the base run and in the new
one (a repeated case's verdict under the new run's pass rule, report/verdicts.py):
- **newly failing** (a regression): passed then, fails now;
- **fixed**: failed then, passes now;
- **still failing**, **still passing**;
- **new** (not in the base run), **removed** (not in the new run);
- **flaky**, over any of the above but new and removed: its verdict changed at least
  twice over the suite's last N runs (`--window N`), or its repetitions disagree in
  the new run. A flaky case is listed, and is not a regression.
A skipped verdict is neither passing nor failing: a case skipped in one run and not in
the other is still passing or still failing by the other run's verdict, or new.

For a regression the diff says where the two conversations first differ: the first turn
whose assertions (or status) differ, the assertion that passed then and fails now, and
what the agent said then and now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from agenttest_worker.report.common import describe_assertion, failure_reason
from agenttest_worker.report.verdicts import verdict
from agenttest_worker.results import AssertionResult, CaseResult, CaseStatus, TurnResult

Category = Literal[
    "regression", "fixed", "still_failing", "still_passing", "new", "removed", "flaky"
]
# In the order a diff lists them: what needs a look first.
CATEGORIES: tuple[Category, ...] = (
    "regression",
    "flaky",
    "fixed",
    "new",
    "removed",
    "still_failing",
    "still_passing",
)
TITLES: dict[Category, str] = {
    "regression": "Newly failing",
    "fixed": "Fixed",
    "still_failing": "Still failing",
    "still_passing": "Still passing",
    "new": "New",
    "removed": "Removed",
    "flaky": "Flaky",
}
# How much of an agent's reply a diff quotes.
SAID_LIMIT = 300


@dataclass(frozen=True)
class RunInfo:
    """A run as a diff names it."""

    id: str
    created_at: datetime | None
    suite: str | None
    status: str

    def as_dict(self) -> dict[str, Any]:
        created = self.created_at.isoformat() if self.created_at else None
        return {"id": self.id, "created_at": created, "suite": self.suite, "status": self.status}


@dataclass(frozen=True)
class Difference:
    """Where a regressed case's two conversations first differ."""

    turn: int | None  # None: in the final assertions, or the case's own error
    assertion: str | None  # the assertion that passed then and fails now, described
    reason: str | None  # why it fails now
    said_then: str | None
    said_now: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "assertion": self.assertion,
            "reason": self.reason,
            "said_then": self.said_then,
            "said_now": self.said_now,
        }


@dataclass
class CaseChange:
    id: str
    category: Category
    base: CaseStatus | None  # its verdict in the base run (None: not there)
    new: CaseStatus | None
    name: str | None = None
    # Why a flaky case is flaky ("changed 3 times in the last 10 runs", ...).
    flaky_because: str | None = None
    difference: Difference | None = None

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "category": self.category,
            "base": self.base,
            "new": self.new,
        }
        if self.flaky_because:
            found["flaky_because"] = self.flaky_because
        if self.difference is not None:
            found["difference"] = self.difference.as_dict()
        return found


@dataclass
class RunDiff:
    base: RunInfo
    new: RunInfo
    window: int
    changes: list[CaseChange] = field(default_factory=list)

    def counts(self) -> dict[Category, int]:
        found: dict[Category, int] = dict.fromkeys(CATEGORIES, 0)
        for change in self.changes:
            found[change.category] += 1
        return found

    def of(self, category: Category) -> list[CaseChange]:
        return [c for c in self.changes if c.category == category]

    @property
    def regressions(self) -> list[CaseChange]:
        return self.of("regression")

    def as_dict(self) -> dict[str, Any]:
        return {
            "base": self.base.as_dict(),
            "new": self.new.as_dict(),
            "window": self.window,
            "counts": self.counts(),
            "cases": [c.as_dict() for c in self.changes],
        }


def tally_verdict(played: int, passed: int, skipped: int, rule: str) -> CaseStatus:
    """A case's verdict from its counts (report/verdicts.verdict over the statuses)."""
    kinds: list[tuple[CaseStatus, int]] = [
        ("passed", passed),
        ("skipped", skipped),
        ("failed", played - passed - skipped),
    ]
    statuses = [status for status, count in kinds for _ in range(count)]
    return verdict(statuses, rule)


def category(base: CaseStatus | None, new: CaseStatus | None) -> Category:
    """The category of a case from its two verdicts (before flakiness is known).

    A skipped verdict fails nothing (a run of skips exits 0): against it, the other
    run's verdict decides, and two skips are still passing."""
    if new is None:
        return "removed"
    if base is None:
        return "new"
    if "skipped" in (base, new):
        other = new if base == "skipped" else base
        return "still_failing" if other == "failed" else "still_passing"
    if base == "passed":
        return "still_passing" if new == "passed" else "regression"
    return "fixed" if new == "passed" else "still_failing"


def difference(then: CaseResult, now: CaseResult) -> Difference:
    """Where `now` (a failing conversation) first departs from `then` (a passing one)."""
    earlier = {turn.turn: turn for turn in then.turns}
    for turn in now.turns:
        before = earlier.get(turn.turn)
        found = _turn_difference(before, turn)
        if found is not None:
            return found
    assertion = _newly_failing(then.final_assertions, now.final_assertions)
    if assertion is not None:
        return Difference(
            None, describe_assertion(assertion), failure_reason(assertion), None, None
        )
    return Difference(None, None, now.error or now.skip_reason, None, None)


def _turn_difference(before: TurnResult | None, turn: TurnResult) -> Difference | None:
    failed_now = turn.status == "failed" or turn.error is not None
    if not failed_now:
        return None
    if (
        before is not None
        and before.status == "failed"
        and not _newly_failing(before.assertions, turn.assertions)
    ):
        return None
    assertion = _newly_failing(before.assertions if before else [], turn.assertions)
    return Difference(
        turn=turn.turn,
        assertion=describe_assertion(assertion) if assertion else None,
        reason=failure_reason(assertion)
        if assertion
        else (turn.error or "; ".join(turn.problems or [])),
        said_then=_said(before) if before else None,
        said_now=_said(turn),
    )


def _newly_failing(
    then: list[AssertionResult], now: list[AssertionResult]
) -> AssertionResult | None:
    """The first assertion that fails now and passed (or was not there) then."""
    passed_then = [a.passed for a in then]
    for index, assertion in enumerate(now):
        if not assertion.passed and (index >= len(passed_then) or passed_then[index]):
            return assertion
    return next((a for a in now if not a.passed), None)


def _said(turn: TurnResult) -> str | None:
    if turn.output is None and not turn.tool_calls:
        return None
    text = turn.output or ""
    if turn.tool_calls:
        calls = ", ".join(call.name for call in turn.tool_calls)
        text = f"{text} [tool calls: {calls}]".strip()
    return text if len(text) <= SAID_LIMIT else text[: SAID_LIMIT - 1] + "…"
