"""What changed between two runs of a suite, case by case.

Each case id falls in one category, from its verdict in the base run and in the new
one (a repeated case's verdict under the new run's pass rule, report/verdicts.py):
- **newly failing** (a regression): passed then, fails now; when the diff weighs pass
  rates (a confidence level, report/significance.py), only a drop that is significant
  is one, and a case whose verdict fell without one is **likely regressed**;
- **fixed**: failed then, passes now;
- **still failing**, **still passing**;
- **new** (not in the base run), **removed** (not in the new run);
- **changed**, over any of the above but new and removed: its definition (the hash of
  its normalized record, case_definitions.py) is not the base run's, so its two
  verdicts are not compared: a changed case is neither a regression nor a fix;
- **flaky**, over any of the above but new, removed and changed: its verdict changed at
  least twice over the suite's last N runs (`--window N`), or its repetitions disagree
  in the new run. A flaky case is listed, and is not a regression.
A skipped verdict is neither passing nor failing: a case skipped in one run and not in
the other is still passing or still failing by the other run's verdict, or new.

For a regression (and a changed case that fails) the diff says where the two
conversations first differ: the first turn whose assertions (or status) differ, the
assertion that passed then and fails now (assertions matched by their hashes, never by
position: one that is new or changed says so), and what the agent said then and now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from agenttest_worker.case_definitions import CaseDefinition
from agenttest_worker.report.common import describe_assertion, failure_reason
from agenttest_worker.report.significance import PassRates
from agenttest_worker.report.verdicts import verdict
from agenttest_worker.results import AssertionResult, CaseResult, CaseStatus, TurnResult

Category = Literal[
    "regression",
    "likely_regression",
    "fixed",
    "still_failing",
    "still_passing",
    "new",
    "removed",
    "flaky",
    "changed",
]
# In the order a diff lists them: what needs a look first.
CATEGORIES: tuple[Category, ...] = (
    "regression",
    "likely_regression",
    "flaky",
    "changed",
    "fixed",
    "new",
    "removed",
    "still_failing",
    "still_passing",
)
TITLES: dict[Category, str] = {
    "regression": "Newly failing",
    "likely_regression": "Likely regressed",
    "fixed": "Fixed",
    "still_failing": "Still failing",
    "still_passing": "Still passing",
    "new": "New",
    "removed": "Removed",
    "flaky": "Flaky",
    "changed": "Changed",
}
# How much of an agent's reply a diff quotes.
SAID_LIMIT = 300
CHANGED_BECAUSE = "its definition changed since the baseline"


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
    # The failing assertion is not in the base run's case (new, or changed).
    new_assertion: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "assertion": self.assertion,
            "reason": self.reason,
            "said_then": self.said_then,
            "said_now": self.said_now,
            "new_assertion": self.new_assertion,
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
    # The hash of its definition in the base run and in the new one (None: not there,
    # or stored before there were).
    base_definition: str | None = None
    new_definition: str | None = None
    # Its pass rates then and now and the test of their drop, when the diff weighs them
    # (a confidence level: report/significance.py).
    rates: PassRates | None = None
    # Why it fails now (report/causes.py), when it does.
    cause: str | None = None
    # Its conversations' time in the new run, and where it is written (JUnit's `time`,
    # `file` and `line`), when the diff was asked for them.
    duration_ms: int | None = None
    file: str | None = None
    line: int | None = None

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
        if self.category == "changed":
            found["changed_because"] = CHANGED_BECAUSE
        if self.difference is not None:
            found["difference"] = self.difference.as_dict()
        if self.rates is not None:
            found["stats"] = self.rates.as_dict()
        if self.cause is not None:
            found["cause"] = self.cause
        return found


@dataclass
class RunDiff:
    base: RunInfo
    new: RunInfo
    window: int
    changes: list[CaseChange] = field(default_factory=list)
    # The noise-aware gate: its confidence level (None: verdicts are compared as they
    # are) and how many of the suite's runs were pooled as the baseline (None: the
    # baseline run alone).
    confidence: float | None = None
    history_window: int | None = None
    # The new run's failed or skipped conversations by cause (report/causes.py).
    causes: dict[str, int] = field(default_factory=dict)
    # Two targets of one run compared (report/target_diff.py): (then, now); None: two
    # runs.
    targets: tuple[str, str] | None = None

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
            "confidence": self.confidence,
            "history_window": self.history_window,
            "causes": self.causes,
            "cases": [c.as_dict() for c in self.changes],
            **(
                {"targets": {"base": self.targets[0], "new": self.targets[1]}}
                if self.targets
                else {}
            ),
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


def gated_category(found: Category, new: CaseStatus | None, rates: PassRates | None) -> Category:
    """A case's category once its pass rates are weighed (report/significance.py): a
    significant drop to a failing verdict is a regression, whatever the verdicts then
    (flaky, a known failure); a verdict that went from passed to failed without a
    significant drop is only a likely regression (repeat it to know). New, removed and
    changed cases are not compared."""
    if rates is None or found in ("new", "removed", "changed"):
        return found
    if rates.significant and new == "failed":
        return "regression"
    if found == "regression":
        return "likely_regression"
    return found


@dataclass(frozen=True)
class Definitions:
    """The definitions (case_definitions.py) of a case in the base run and in the new
    one, when both were stored: their assertions are then matched by hash."""

    then: CaseDefinition
    now: CaseDefinition


class _Checked:
    """A list of assertion results, each with its hash (or its position when the case
    was stored without hashes)."""

    def __init__(self, results: list[AssertionResult], hashes: list[str] | None) -> None:
        self.results = results
        if hashes is None or len(hashes) != len(results):
            self.keys: list[str] = [f"#{i}" for i in range(len(results))]
        else:
            self.keys = hashes


def difference(
    then: CaseResult, now: CaseResult, definitions: Definitions | None = None
) -> Difference:
    """Where `now` (a failing conversation) first departs from `then` (a passing one)."""
    earlier = {turn.turn: turn for turn in then.turns}
    for turn in now.turns:
        before = earlier.get(turn.turn)
        found = _turn_difference(before, turn, definitions)
        if found is not None:
            return found
    found_final = _newly_failing(
        _Checked(then.final_assertions, definitions.then.final if definitions else None),
        _Checked(now.final_assertions, definitions.now.final if definitions else None),
    )
    if found_final is not None:
        assertion, is_new = found_final
        return Difference(
            None,
            describe_assertion(assertion),
            failure_reason(assertion),
            None,
            None,
            new_assertion=is_new,
        )
    return Difference(None, None, now.error or now.skip_reason, None, None)


def _turn_checked(
    turn: TurnResult | None, definition: CaseDefinition | None, number: int
) -> _Checked:
    hashes = definition.of_turn(number) if definition is not None else None
    return _Checked(turn.assertions if turn else [], hashes)


def _turn_difference(
    before: TurnResult | None, turn: TurnResult, definitions: Definitions | None
) -> Difference | None:
    failed_now = turn.status == "failed" or turn.error is not None
    if not failed_now:
        return None
    then = _turn_checked(before, definitions.then if definitions else None, turn.turn)
    now = _turn_checked(turn, definitions.now if definitions else None, turn.turn)
    found = _newly_failing(then, now)
    if before is not None and before.status == "failed" and found is None:
        return None
    assertion, is_new = found if found else (_first_failing(turn.assertions), False)
    return Difference(
        turn=turn.turn,
        assertion=describe_assertion(assertion) if assertion else None,
        reason=failure_reason(assertion)
        if assertion
        else (turn.error or "; ".join(turn.problems or [])),
        said_then=_said(before) if before else None,
        said_now=_said(turn),
        new_assertion=is_new,
    )


def _first_failing(results: list[AssertionResult]) -> AssertionResult | None:
    return next((a for a in results if not a.passed), None)


def _newly_failing(then: _Checked, now: _Checked) -> tuple[AssertionResult, bool] | None:
    """The first assertion that fails now and passed then, matched by hash (or was
    not there then: the flag says so)."""
    passed_then: dict[str, list[bool]] = {}
    for key, result in zip(then.keys, then.results, strict=True):
        passed_then.setdefault(key, []).append(result.passed)
    for key, result in zip(now.keys, now.results, strict=True):
        earlier = passed_then.get(key)
        was = earlier.pop(0) if earlier else None
        if not result.passed and was is not False:
            return result, was is None
    return None


def _said(turn: TurnResult) -> str | None:
    if turn.output is None and not turn.tool_calls:
        return None
    text = turn.output or ""
    if turn.tool_calls:
        calls = ", ".join(call.name for call in turn.tool_calls)
        text = f"{text} [tool calls: {calls}]".strip()
    return text if len(text) <= SAID_LIMIT else text[: SAID_LIMIT - 1] + "…"
