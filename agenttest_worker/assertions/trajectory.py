"""Assertions on the agent's tool trajectory: tool_sequence, tool_count, turn_count.

They read the calls of the turn, or for final assertions of the whole conversation in
the order made; a turn's calls include those of every mocked tool round of it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.assertions.tools import args_match
from agenttest_worker.json_values import json_equal
from agenttest_worker.observe import received_spans
from agenttest_worker.results import ToolCall

ArgsMode = Literal["exact", "subset", "ignore"]


class ExpectedCall(BaseModel):
    """One listed call: its tool, and the arguments to compare (none given: not compared).

    `args_mode` overrides the assertion's `args` mode for this call.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    args: dict[str, Any] | None = None
    args_mode: ArgsMode | None = None


class ToolSequenceAssertion(AssertionSpec):
    """The calls made, compared with `calls` as `order` says:

    exact: the same calls in the same order, nothing else; in_order: the listed calls in
    this order, others may come between; any_order: the same calls, in any order;
    subset: every call made is one of the listed; superset: every listed call was made
    (each by a call of its own), others may be too.
    """

    type: Literal["tool_sequence"]
    calls: list[ExpectedCall]
    order: Literal["exact", "in_order", "any_order", "subset", "superset"] = "exact"
    args: ArgsMode = "subset"
    # "trace": the tool executions among the spans the agent sent (its internal calls,
    # observe/received_spans.py) instead of the tool calls in its replies.
    source: Literal["reply", "trace"] = "reply"


def _bounds_given(data: Any) -> Any:
    if isinstance(data, dict) and data.get("min") is None and data.get("max") is None:
        raise ValueError("give min, max or both")
    return data


class Bounded(AssertionSpec):
    """An assertion on a count: at least `min`, at most `max` (one of them at least)."""

    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    _given = model_validator(mode="before")(_bounds_given)

    @model_validator(mode="after")
    def _ordered(self) -> Bounded:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self

    def within(self, count: int) -> bool:
        return (self.min is None or count >= self.min) and (self.max is None or count <= self.max)

    def bounds(self) -> str:
        if self.min is not None and self.max is not None:
            return f"between {self.min} and {self.max}"
        return f"at least {self.min}" if self.max is None else f"at most {self.max}"


class ToolCountAssertion(Bounded):
    """How many calls to `name` (to any tool, without `name`) were made."""

    type: Literal["tool_count"]
    name: str | None = None


class TurnCountAssertion(Bounded):
    """How many turns the conversation played (final_assertions only)."""

    type: Literal["turn_count"]


def _matcher(spec: ToolSequenceAssertion, expected: ExpectedCall) -> Callable[[ToolCall], bool]:
    mode = expected.args_mode or spec.args
    wanted = expected.args

    def matches(call: ToolCall) -> bool:
        if call.name != expected.name:
            return False
        if wanted is None or mode == "ignore":
            return True
        return json_equal(call.args, wanted) if mode == "exact" else args_match(wanted, call.args)

    return matches


def _pairing(
    rules: Sequence[Callable[[ToolCall], bool]], calls: Sequence[ToolCall]
) -> list[int | None]:
    """For each rule, a distinct call it matches, as many rules matched as can be
    (augmenting paths: a greedy choice can take the call a later rule needed)."""
    owner: dict[int, int] = {}

    def place(rule: int, seen: set[int]) -> bool:
        for index, call in enumerate(calls):
            if index in seen or not rules[rule](call):
                continue
            seen.add(index)
            if index not in owner or place(owner[index], seen):
                owner[index] = rule
                return True
        return False

    for rule in range(len(rules)):
        place(rule, set())
    found: list[int | None] = [None] * len(rules)
    for index, rule in owner.items():
        found[rule] = index
    return found


def _show(call: ToolCall | ExpectedCall) -> str:
    if call.args is None or call.args == {}:
        return call.name
    return f"{call.name}({json.dumps(call.args, default=str)})"


def _listed(calls: Sequence[ToolCall | ExpectedCall]) -> str:
    return ", ".join(_show(c) for c in calls) or "none"


def _sequence_failure(spec: ToolSequenceAssertion, calls: list[ToolCall]) -> str | None:
    rules = [_matcher(spec, expected) for expected in spec.calls]
    if spec.order == "exact":
        for index, (rule, expected) in enumerate(zip(rules, spec.calls, strict=False)):
            wanted = f"call {index + 1} should be {_show(expected)}"
            if index >= len(calls):
                return f"{wanted}, but only {len(calls)} were made"
            if not rule(calls[index]):
                return f"{wanted}, was {_show(calls[index])}"
        if len(calls) > len(rules):
            extra = len(calls) - len(rules)
            return f"{extra} more call(s) than listed, from {_show(calls[len(rules)])}"
        return None
    if spec.order == "in_order":
        position = 0
        for rule, expected in zip(rules, spec.calls, strict=True):
            while position < len(calls) and not rule(calls[position]):
                position += 1
            if position == len(calls):
                return f"no {_show(expected)} after the calls before it in the list"
            position += 1
        return None
    if spec.order == "subset":
        stray = [c for c in calls if not any(rule(c) for rule in rules)]
        return f"called tools not in the list: {_listed(stray)}" if stray else None
    pairing = _pairing(rules, calls)
    missing = [e for e, found in zip(spec.calls, pairing, strict=True) if found is None]
    if missing:
        return f"not called: {_listed(missing)}"
    if spec.order == "any_order" and len(calls) != len(rules):
        used = set(pairing)
        unlisted = [c for i, c in enumerate(calls) if i not in used]
        return f"called more than listed: {_listed(unlisted)}"
    return None


@register(ToolSequenceAssertion)
def check_tool_sequence(
    spec: ToolSequenceAssertion, ctx: AssertionContext
) -> AssertionOutcome | Awaitable[AssertionOutcome]:
    if spec.source == "trace":
        return _traced_sequence(spec, ctx)
    return _sequence_outcome(spec, ctx.tool_calls)


async def _traced_sequence(spec: ToolSequenceAssertion, ctx: AssertionContext) -> AssertionOutcome:
    try:
        spans = await received_spans.received(ctx.final)
    except received_spans.NoSpans as exc:
        return AssertionOutcome(False, str(exc), error=str(exc))
    return _sequence_outcome(spec, received_spans.tool_calls_of(spans))


def _sequence_outcome(spec: ToolSequenceAssertion, calls: list[ToolCall]) -> AssertionOutcome:
    failure = _sequence_failure(spec, calls)
    order = spec.order.replace("_", " ")
    if failure is None:
        return AssertionOutcome(True, f"calls match ({order}): {_listed(calls)}")
    return AssertionOutcome(
        False,
        f"{failure}; expected ({order}): {_listed(spec.calls)}; called: {_listed(calls)}",
    )


@register(ToolCountAssertion)
def check_tool_count(spec: ToolCountAssertion, ctx: AssertionContext) -> AssertionOutcome:
    count = sum(1 for c in ctx.tool_calls if spec.name is None or c.name == spec.name)
    what = f"{spec.name} was called" if spec.name else "tools were called"
    scope = "in the conversation" if ctx.final else "in this turn"
    verdict = f"{what} {count} time(s) {scope}, expected {spec.bounds()}"
    return AssertionOutcome(spec.within(count), verdict)


@register(TurnCountAssertion)
def check_turn_count(spec: TurnCountAssertion, ctx: AssertionContext) -> AssertionOutcome:
    if not ctx.final or not isinstance(ctx.document, dict):
        return AssertionOutcome(
            False, "turn_count is a final assertion: put it in final_assertions"
        )
    count = len(ctx.document.get("turns") or [])
    return AssertionOutcome(
        spec.within(count), f"the conversation played {count} turn(s), expected {spec.bounds()}"
    )
