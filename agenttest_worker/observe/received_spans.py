"""Spans received from agents (OTLP, observe/otlp_decoding.py): what is kept of one, which
of a conversation's trace belong to a turn, and how a trace assertion waits for them.

A turn's spans are those whose W3C `tracestate` carries agenttest's entry for it
(`agenttest=turn:N`: an SDK hands its parent's tracestate to every span it starts), or
that descend from one of the turn's calls to its target (the parent id each call sent
in `traceparent`). Agents export in batches, after the reply: an assertion waits up to
AGENTTEST_TRACE_WAIT seconds for the turn's first span, then until none came for
`QUIET_SECONDS`, and every assertion of the turn reads what that wait settled on.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from agenttest_worker.results import ToolCall

QUIET_SECONDS = 0.5
_POLL_SECONDS = 0.1
TURN_ENTRY = "agenttest"


class AgentSpan(BaseModel):
    """One span an agent sent, bounded (otlp_decoding.py) and untrusted: every text in
    it is data wherever it is shown."""

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    name: str
    start_ns: int
    end_ns: int
    error: bool = False
    status_message: str | None = None
    # The turn its tracestate names (agenttest=turn:N), when it names one.
    turn: int | None = None
    service: str | None = None
    attributes: dict[str, Any] = {}

    @property
    def duration_ms(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e6

    def tool_call(self) -> tuple[str, Any] | None:
        """(tool name, arguments) when the span is a tool's execution, as the GenAI
        conventions write one (`gen_ai.operation.name` execute_tool, `gen_ai.tool.name`,
        `gen_ai.tool.call.arguments`)."""
        attrs = self.attributes
        if attrs.get("gen_ai.operation.name") != "execute_tool":
            return None
        name = attrs.get("gen_ai.tool.name")
        if not isinstance(name, str):
            name = self.name.removeprefix("execute_tool").strip()
        return name, attrs.get("gen_ai.tool.call.arguments")


def turn_of(tracestate: str) -> int | None:
    """The turn agenttest's entry of a W3C tracestate names, if any."""
    for member in tracestate.split(","):
        key, _, value = member.strip().partition("=")
        number = value[5:]
        if key == TURN_ENTRY and value.startswith("turn:") and number.isdigit() and len(number) < 9:
            return int(number)
    return None


def tool_calls_of(spans: list[AgentSpan]) -> list[ToolCall]:
    """The tool executions among `spans`, in the order they started, as tool calls
    (arguments parsed when they are JSON text)."""
    calls = []
    for span in sorted(spans, key=lambda s: s.start_ns):
        found = span.tool_call()
        if found is not None:
            name, args = found
            calls.append(ToolCall(name=name, args=_parsed(args), id=span.span_id))
    return calls


def _parsed(args: Any) -> Any:
    if not isinstance(args, str):
        return args if args is not None else {}
    try:
        return json.loads(args)
    except (ValueError, RecursionError):
        return args


class SpanReader(Protocol):
    """Where received spans are read: the store (store/sql/agent_spans.py)."""

    def spans_of(self, trace_id: str) -> list[AgentSpan]: ...


def of_turn(spans: list[AgentSpan], turn: int, call_ids: set[str]) -> list[AgentSpan]:
    """The spans of `spans` (one trace) that belong to `turn`, by start time."""
    by_id = {span.span_id: span for span in spans}

    def belongs(span: AgentSpan) -> bool:
        seen: set[str] = set()
        current: AgentSpan | None = span
        while current is not None and current.span_id not in seen:
            if current.turn is not None:
                return current.turn == turn
            parent = current.parent_span_id
            if parent is None:
                return False
            if parent in call_ids:
                return True
            seen.add(current.span_id)
            current = by_id.get(parent)
        return False

    return sorted((s for s in spans if belongs(s)), key=lambda s: s.start_ns)


@dataclass
class TurnTrace:
    """The turn being played, as the trace assertions of its step see it."""

    trace_id: str
    turn: int
    reader: SpanReader | None
    wait_seconds: float
    # The span ids of the turn's calls to its target (each sent as `traceparent`'s parent).
    call_ids: set[str] = field(default_factory=set)
    # What the wait settled on: the turn's spans, and the whole trace's.
    _settled: dict[bool, list[AgentSpan]] = field(default_factory=dict)


_CURRENT: ContextVar[TurnTrace | None] = ContextVar("agenttest_turn_trace", default=None)


def current_turn() -> TurnTrace | None:
    return _CURRENT.get()


def enter_turn(trace: TurnTrace) -> Any:
    """Make `trace` the turn being played; returns the token `leave_turn` takes."""
    return _CURRENT.set(trace)


def leave_turn(token: Any) -> None:
    _CURRENT.reset(token)


def note_target_call(span_id: str) -> None:
    """A call to the target was made with `span_id` as its traceparent's parent."""
    current = _CURRENT.get()
    if current is not None:
        current.call_ids.add(span_id)


class NoSpans(Exception):
    """Why a trace assertion has no spans to read."""


async def received(whole_trace: bool) -> list[AgentSpan]:
    """The turn's spans (with `whole_trace`: the conversation's), once they have
    arrived as the module docstring says; NoSpans when nothing can be read."""
    trace = _CURRENT.get()
    if trace is None:
        raise NoSpans("no spans to read: they are read while the turn is played, not re-judged")
    if trace.reader is None:
        raise NoSpans(
            "no spans are received: set AGENTTEST_OTLP_RECEIVER_PORT and point the "
            "agent's OTLP exporter at it"
        )
    settled = trace._settled.get(whole_trace)
    if settled is not None:
        return settled
    reader = trace.reader
    deadline = time.monotonic() + trace.wait_seconds
    count, changed = -1, time.monotonic()
    while True:
        spans = await asyncio.to_thread(reader.spans_of, trace.trace_id)
        chosen = spans if whole_trace else of_turn(spans, trace.turn, trace.call_ids)
        now = time.monotonic()
        if len(chosen) != count:
            count, changed = len(chosen), now
        elif chosen and now - changed >= QUIET_SECONDS:
            break
        if now >= deadline:
            break
        await asyncio.sleep(_POLL_SECONDS)
    trace._settled[whole_trace] = chosen
    return chosen
