"""tool_called: the agent called a tool, optionally with (a subset of) given arguments;
tool_not_called: it made no such call."""

from __future__ import annotations

import json
from typing import Any, Literal

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.json_values import json_equal


class ToolCalledAssertion(AssertionSpec):
    """Passes when a call to `name` was made in the turn (in any turn, for final assertions).

    With `args`, the call's arguments must include each given key with an equal value;
    arguments the case does not mention are not checked.
    """

    type: Literal["tool_called"]
    name: str
    args: dict[str, Any] | None = None


class ToolNotCalledAssertion(AssertionSpec):
    """Fails when a call to `name` was made in the turn (in any turn, for final assertions).

    With `args`, only a call whose arguments include each given key with an equal value
    fails it: `{name: issue_refund, args: {amount: 500}}` allows other refunds.
    """

    type: Literal["tool_not_called"]
    name: str
    args: dict[str, Any] | None = None


def args_match(expected: dict[str, Any], actual: Any) -> bool:
    if not isinstance(actual, dict):
        return False
    return all(k in actual and json_equal(actual[k], v) for k, v in expected.items())


@register(ToolCalledAssertion)
def check_tool_called(spec: ToolCalledAssertion, ctx: AssertionContext) -> AssertionOutcome:
    scope = "the conversation" if ctx.final else "this turn"
    calls = [c for c in ctx.tool_calls if c.name == spec.name]
    called = ", ".join(sorted({c.name for c in ctx.tool_calls})) or "none"
    if not calls:
        return AssertionOutcome(False, f"{spec.name} was not called in {scope} (called: {called})")
    if spec.args is None:
        return AssertionOutcome(True, f"{spec.name} was called")
    if any(args_match(spec.args, c.args) for c in calls):
        return AssertionOutcome(True, f"{spec.name} was called with {json.dumps(spec.args)}")
    seen = "; ".join(json.dumps(c.args, default=str) for c in calls)
    return AssertionOutcome(
        False, f"{spec.name} was called, but not with {json.dumps(spec.args)} (args: {seen})"
    )


@register(ToolNotCalledAssertion)
def check_tool_not_called(spec: ToolNotCalledAssertion, ctx: AssertionContext) -> AssertionOutcome:
    scope = "the conversation" if ctx.final else "this turn"
    expected = spec.args
    calls = [
        c
        for c in ctx.tool_calls
        if c.name == spec.name and (expected is None or args_match(expected, c.args))
    ]
    if not calls:
        with_args = f" with {json.dumps(spec.args)}" if spec.args is not None else ""
        return AssertionOutcome(True, f"{spec.name} was not called{with_args} in {scope}")
    seen = "; ".join(json.dumps(c.args, default=str) for c in calls)
    return AssertionOutcome(False, f"tool {spec.name} was called with {seen}")
