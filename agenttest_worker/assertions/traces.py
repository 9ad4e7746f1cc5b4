"""Assertions on the spans the agent sent of its turn (its trace, received over OTLP):
trace_tool_called, trace_span_count, trace_error_spans, trace_duration; and
tool_sequence with `source: trace` (trajectory.py).

Each reads the turn's spans (final assertions: the whole conversation's) once they have
arrived: observe/received_spans.py says how long it waits. A turn whose agent sent no
span fails every one of them but a trace_span_count that allows none: none arrived is
not a trace without errors, nor a tool not called.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import Field, field_validator

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.assertions.tools import args_match
from agenttest_worker.assertions.trajectory import Bounded
from agenttest_worker.durations import format_duration, parse_duration
from agenttest_worker.observe import received_spans
from agenttest_worker.observe.received_spans import AgentSpan, NoSpans


class TraceToolCalledAssertion(AssertionSpec):
    """Passes when the agent's spans hold an execution of tool `name` (with `args`: one
    whose arguments include each given key with an equal value)."""

    type: Literal["trace_tool_called"]
    name: str
    args: dict[str, Any] | None = None


class TraceSpanCountAssertion(Bounded):
    """How many spans the agent sent (named like `name`, a glob such as `db.*`)."""

    type: Literal["trace_span_count"]
    name: str | None = None


class TraceErrorSpansAssertion(AssertionSpec):
    """At most `max` (0 unless given) of the agent's spans ended with an error status."""

    type: Literal["trace_error_spans"]
    max: int = Field(default=0, ge=0)


class TraceDurationAssertion(AssertionSpec):
    """Every span named `name` (a glob) took at most `max` ("2s", "250ms", seconds)."""

    type: Literal["trace_duration"]
    name: str
    max: float

    @field_validator("max", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError('a duration: "2s", "250ms" or a number of seconds')
        return parse_duration(value)


def _scope(ctx: AssertionContext) -> str:
    return "the conversation" if ctx.final else "this turn"


def _named(spans: list[AgentSpan], pattern: str | None) -> list[AgentSpan]:
    return [s for s in spans if pattern is None or fnmatchcase(s.name, pattern)]


async def _spans(ctx: AssertionContext) -> list[AgentSpan] | AssertionOutcome:
    """The agent's spans of the turn (of the conversation, for final assertions), or
    the failure that says why none can be read."""
    try:
        return await received_spans.received(ctx.final)
    except NoSpans as exc:
        return AssertionOutcome(False, str(exc), error=str(exc))


def _none_arrived(ctx: AssertionContext) -> AssertionOutcome:
    message = f"the agent sent no span of {_scope(ctx)}"
    return AssertionOutcome(False, message, error=message)


@register(TraceToolCalledAssertion)
async def check_trace_tool_called(
    spec: TraceToolCalledAssertion, ctx: AssertionContext
) -> AssertionOutcome:
    spans = await _spans(ctx)
    if isinstance(spans, AssertionOutcome):
        return spans
    if not spans:
        return _none_arrived(ctx)
    calls = received_spans.tool_calls_of(spans)
    made = [c for c in calls if c.name == spec.name]
    called = ", ".join(sorted({c.name for c in calls})) or "none"
    if not made:
        return AssertionOutcome(
            False, f"{spec.name} was not called in {_scope(ctx)}'s trace (called: {called})"
        )
    if spec.args is None or any(args_match(spec.args, c.args) for c in made):
        given = f" with {json.dumps(spec.args)}" if spec.args is not None else ""
        return AssertionOutcome(True, f"{spec.name} was called{given} (trace)")
    seen = "; ".join(json.dumps(c.args, default=str) for c in made)
    return AssertionOutcome(
        False, f"{spec.name} was called, but not with {json.dumps(spec.args)} (args: {seen})"
    )


@register(TraceSpanCountAssertion)
async def check_trace_span_count(
    spec: TraceSpanCountAssertion, ctx: AssertionContext
) -> AssertionOutcome:
    spans = await _spans(ctx)
    if isinstance(spans, AssertionOutcome):
        return spans
    count = len(_named(spans, spec.name))
    passed = spec.within(count)
    what = f"spans named {spec.name}" if spec.name else "spans"
    bounds = " and ".join(
        part
        for part in (
            f"at least {spec.min}" if spec.min is not None else "",
            f"at most {spec.max}" if spec.max is not None else "",
        )
        if part
    )
    return AssertionOutcome(passed, f"{count} {what} in {_scope(ctx)}, expected {bounds}")


@register(TraceErrorSpansAssertion)
async def check_trace_error_spans(
    spec: TraceErrorSpansAssertion, ctx: AssertionContext
) -> AssertionOutcome:
    spans = await _spans(ctx)
    if isinstance(spans, AssertionOutcome):
        return spans
    if not spans:
        return _none_arrived(ctx)
    failed = [s for s in spans if s.error]
    if len(failed) <= spec.max:
        return AssertionOutcome(True, f"{len(failed)} of {len(spans)} spans ended in error")
    shown = "; ".join(
        f"{s.name}: {s.status_message}" if s.status_message else s.name for s in failed[:5]
    )
    return AssertionOutcome(
        False, f"{len(failed)} spans ended in error, at most {spec.max} allowed ({shown})"
    )


@register(TraceDurationAssertion)
async def check_trace_duration(
    spec: TraceDurationAssertion, ctx: AssertionContext
) -> AssertionOutcome:
    spans = await _spans(ctx)
    if isinstance(spans, AssertionOutcome):
        return spans
    named = _named(spans, spec.name)
    if not named:
        return AssertionOutcome(False, f"no span named {spec.name} in {_scope(ctx)}")
    slowest = max(named, key=lambda s: s.duration_ms)
    took = format_duration(slowest.duration_ms / 1000)
    limit = format_duration(spec.max)
    if slowest.duration_ms <= spec.max * 1000:
        return AssertionOutcome(True, f"{spec.name}: the slowest of {len(named)} took {took}")
    return AssertionOutcome(False, f"{slowest.name} took {took}, more than {limit}")
