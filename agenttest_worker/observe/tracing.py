"""Traces: every conversation a trace, exported over OTLP with the OpenTelemetry SDK, and
the W3C trace context every call to a target carries (docs/opentelemetry.md).

The only module that imports OpenTelemetry, and only once a trace is to be exported: with
the `otel` extra installed and OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) set.
Otherwise nothing is exported and nothing of the SDK is imported, but the ids still
exist: a conversation's trace id is drawn when its first turn is played, kept in its
state (engine/state.py `ConversationState.trace`, so that any worker playing a later turn
continues the same trace), and sent to its target in `traceparent`, so that an
instrumented agent's spans can be received and attached to the turn without an exporter.

The spans: a run span (its ids derived from the run's id, so that every conversation can
link to it from any worker), a conversation span (the root of its trace, emitted when
the conversation ends, with the ids and start time kept in its state: the SDK takes
them from `_PRESET`, through the IdGenerator this module gives it), a span per turn (a
child of the conversation's span, on whatever worker plays it) and a span per agent
call ("chat {model}", the GenAI semantic conventions' client span).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agenttest_worker.observe.received_spans import note_target_call
from agenttest_worker.results import AgentCallRecord, AssertionResult, TurnResult

log = logging.getLogger(__name__)

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# An attribute that quotes what an agent or a judge said is cut to this many characters.
MAX_ATTRIBUTE_CHARS = 4096
# The provider names of the GenAI conventions, by the protocol an agent is called with.
_PROVIDERS = {
    "openai": "openai",
    "openai-responses": "openai",
    "azure": "azure.ai.openai",
    "anthropic": "anthropic",
}


class ConversationTrace(BaseModel):
    """A conversation's trace as its state keeps it: the trace's id, its conversation
    span's id (both hex, as W3C writes them) and when that span started (ns since the
    epoch)."""

    trace_id: str
    span_id: str
    started_ns: int


@dataclass(frozen=True)
class SpanIds:
    trace_id: str
    span_id: str
    # The W3C `tracestate` a call made in this span sends: agenttest's entry names the
    # turn (`agenttest=turn:3`).
    tracestate: str = ""
    # False inside a call to another role than the target (a judge, a simulator): the
    # agent under test alone is sent the trace context.
    propagate: bool = True


# The span whose trace context a call made now carries: a turn's or an agent call's.
_ACTIVE: ContextVar[SpanIds | None] = ContextVar("agenttest_active_span", default=None)
# Ids the next span started here takes (the IdGenerator below reads them).
_PRESET: ContextVar[SpanIds | None] = ContextVar("agenttest_preset_ids", default=None)


def new_conversation_trace(run_id: str) -> ConversationTrace:
    """A conversation's trace: its id's first half names the run (`run_trace_prefix`),
    so that the receiver knows whose spans it is sent; the second half is random."""
    trace_id = run_trace_prefix(run_id) + secrets.token_hex(8)
    return ConversationTrace(trace_id=trace_id, span_id=_span_id(), started_ns=time.time_ns())


def run_trace_prefix(run_id: str) -> str:
    return hashlib.sha256(b"agenttest-trace\0" + run_id.encode()).hexdigest()[:16]


def run_span_ids(run_id: str) -> SpanIds:
    """The run span's ids, the same wherever they are asked for (a hash of the run's
    random id: as random as it)."""
    digest = hashlib.sha256(b"agenttest-run\0" + run_id.encode()).hexdigest()
    return SpanIds(digest[:32], digest[32:48])


def _span_id() -> str:
    return secrets.token_hex(8)


def propagation_headers() -> dict[str, str]:
    """`traceparent` and `tracestate` for a call made now, or none outside a turn.

    Always sampled (flag 01), tracing on or off: an agent whose SDK samples by its
    parent then records its spans, which agenttest's receiver takes in."""
    ids = _ACTIVE.get()
    if ids is None or not ids.propagate:
        return {}
    headers = {"traceparent": f"00-{ids.trace_id}-{ids.span_id}-01"}
    if ids.tracestate:
        headers["tracestate"] = ids.tracestate
    return headers


def capture_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


# -- the SDK, when exporting -------------------------------------------------------------

_lock = threading.Lock()
_provider: Any = None
_provider_tracer: Any = None
_provider_pid: int | None = None


def _wanted() -> bool:
    """Whether this process exports spans: an OTLP endpoint is set, the SDK is not
    disabled and no other exporter is chosen (the `otel` extra is asked for after)."""
    if not any(os.environ.get(name, "").strip() for name in _ENDPOINT_ENVS):
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("otlp", "")


def _tracer() -> Any:
    """The SDK's tracer of this process, built on first use (after a fork, again: a
    forked child does not inherit the parent's export thread), or None."""
    global _provider, _provider_tracer, _provider_pid
    pid = os.getpid()
    if _provider_pid == pid:
        return _provider_tracer
    if not _wanted():
        return None
    with _lock:
        if _provider_pid != pid:
            _provider = _build_provider()
            _provider_tracer = _provider.get_tracer("agenttest") if _provider else None
            _provider_pid = pid
    return _provider_tracer


def _build_provider() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry SDK is not installed: "
            "no spans are exported (pip install 'agenttest[otel]')"
        )
        return None

    class PresetIds(IdGenerator):
        """Random ids, except for a span whose ids were drawn before it is emitted."""

        def __init__(self) -> None:
            self._random = RandomIdGenerator()

        def generate_span_id(self) -> int:
            preset = _PRESET.get()
            return int(preset.span_id, 16) if preset else int(self._random.generate_span_id())

        def generate_trace_id(self) -> int:
            preset = _PRESET.get()
            return int(preset.trace_id, 16) if preset else int(self._random.generate_trace_id())

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the exporter
    # its endpoint, headers, timeout and compression from the OTEL_EXPORTER_OTLP_* ones.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "agenttest"}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=PresetIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def flush(timeout_s: float = 10.0) -> None:
    """Export what this process's spans are waiting for (before a process ends)."""
    if _provider is not None and _provider_pid == os.getpid():
        _provider.force_flush(int(timeout_s * 1000))


def _parent(ids: SpanIds) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    context = SpanContext(
        int(ids.trace_id, 16),
        int(ids.span_id, 16),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(context))


def _ids_of(span: Any, tracestate: str = "") -> SpanIds:
    context = span.get_span_context()
    return SpanIds(f"{context.trace_id:032x}", f"{context.span_id:016x}", tracestate)


def _cut(text: str | None) -> str:
    return (text or "")[:MAX_ATTRIBUTE_CHARS]


def _error_status(span: Any, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, _cut(message)))


def _assertion_events(span: Any, assertions: Sequence[AssertionResult], final: bool) -> None:
    for result in assertions:
        attributes: dict[str, Any] = {
            "agenttest.assertion.type": result.type,
            "agenttest.assertion.passed": bool(result.passed),
            "agenttest.assertion.final": final,
        }
        if result.reason:
            attributes["agenttest.assertion.reason"] = _cut(result.reason)
        span.add_event("agenttest.assertion", attributes)


# -- the spans ----------------------------------------------------------------------------


class TurnSpan:
    """A turn's span while it is played; `finish` records what the turn came to."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def finish(self, turns: Sequence[TurnResult]) -> None:
        span = self._span
        if span is None:
            return
        for result in turns:
            span.set_attribute("agenttest.turn.status", result.status)
            if result.input_source:
                span.set_attribute("agenttest.turn.input_source", result.input_source)
            if capture_content():
                span.set_attribute("agenttest.turn.input", _cut(result.input))
                span.set_attribute("agenttest.turn.output", _cut(result.output))
            _assertion_events(span, result.assertions, final=False)
            if result.error:
                _error_status(span, result.error)


@contextmanager
def turn_span(trace: ConversationTrace, run_id: str, case_id: str, turn: int) -> Iterator[TurnSpan]:
    """A turn's span, the child of its conversation's, current while the turn is played."""
    tracer = _tracer()
    state = f"agenttest=turn:{turn}"
    if tracer is None:
        token = _ACTIVE.set(SpanIds(trace.trace_id, _span_id(), state))
        try:
            yield TurnSpan(None)
        finally:
            _ACTIVE.reset(token)
        return
    attributes = {
        "agenttest.run.id": run_id,
        "agenttest.case.id": case_id,
        "agenttest.turn.number": turn,
    }
    parent = _parent(SpanIds(trace.trace_id, trace.span_id))
    with tracer.start_as_current_span(
        # No exception recorded: its text is not the report's, whose secrets are masked.
        "agenttest.turn",
        context=parent,
        attributes=attributes,
        record_exception=False,
    ) as span:
        token = _ACTIVE.set(_ids_of(span, state))
        try:
            yield TurnSpan(span)
        finally:
            _ACTIVE.reset(token)


class CallSpan:
    """An agent call's span while it is made; `finish` records its reply."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def finish(
        self, content: str | None, finish_reason: str | None, call: AgentCallRecord | None
    ) -> None:
        span = self._span
        if span is None:
            return
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if call is not None:
            _call_attributes(span, call)
        if capture_content():
            output = [{"role": "assistant", "parts": [{"type": "text", "content": content or ""}]}]
            if finish_reason:
                output[0]["finish_reason"] = finish_reason
            span.set_attribute("gen_ai.output.messages", _cut(json.dumps(output)))

    def failed(self, message: str, call: AgentCallRecord | None) -> None:
        if self._span is None:
            return
        if call is not None:
            _call_attributes(self._span, call)
        self._span.set_attribute("error.type", "agent_error")
        _error_status(self._span, message)


def _call_attributes(span: Any, call: AgentCallRecord) -> None:
    if call.usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", call.usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", call.usage.completion_tokens)
    if call.status_code is not None:
        span.set_attribute("http.response.status_code", call.status_code)
    span.set_attribute("agenttest.call.attempts", call.attempts)


@dataclass(frozen=True)
class CallTarget:
    """Who is called: the agent's role, its name in agenttest.yaml, its protocol and model."""

    role: str
    agent: str
    protocol: str
    model: str | None


@contextmanager
def call_span(target: CallTarget, messages: list[dict[str, Any]]) -> Iterator[CallSpan]:
    """An agent call's span ("chat {model}"), current while the call is made: the
    `traceparent` a target is sent names it as the parent of the agent's spans."""
    tracer = _tracer()
    if tracer is None:
        current = _ACTIVE.get()
        if current is None:
            yield CallSpan(None)
            return
        ids = SpanIds(current.trace_id, _span_id(), current.tracestate, target.role == "target")
        if ids.propagate:
            note_target_call(ids.span_id)
        token = _ACTIVE.set(ids)
        try:
            yield CallSpan(None)
        finally:
            _ACTIVE.reset(token)
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": _PROVIDERS.get(target.protocol, target.protocol),
        "gen_ai.system": _PROVIDERS.get(target.protocol, target.protocol),
        "agenttest.agent.role": target.role,
        "agenttest.agent.name": target.agent,
    }
    if target.model:
        attributes["gen_ai.request.model"] = target.model
    if capture_content():
        attributes["gen_ai.input.messages"] = _cut(json.dumps(_input_messages(messages)))
    name = f"chat {target.model}" if target.model else "chat"
    with tracer.start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes=attributes, record_exception=False
    ) as span:
        current = _ACTIVE.get()
        ids = _ids_of(span, current.tracestate if current else "")
        ids = dataclasses.replace(ids, propagate=target.role == "target")
        if ids.propagate:
            note_target_call(ids.span_id)
        token = _ACTIVE.set(ids)
        try:
            yield CallSpan(span)
        finally:
            _ACTIVE.reset(token)


def _input_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions messages in the conventions' shape (role and text parts)."""
    shaped = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        shaped.append(
            {"role": str(message.get("role", "")), "parts": [{"type": "text", "content": text}]}
        )
    return shaped


@dataclass(frozen=True)
class ConversationEnd:
    """A conversation as it ended, for its span."""

    run_id: str
    case_id: str
    status: str
    error: str | None
    final_assertions: Sequence[AssertionResult]
    turns: int


def end_conversation(trace: ConversationTrace, end: ConversationEnd) -> None:
    """Emit a conversation's span, the root of its trace, with the ids and start its
    state kept since its first turn; it links to its run's span."""
    tracer = _tracer()
    if tracer is None:
        return
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    run = run_span_ids(end.run_id)
    link = Link(
        SpanContext(
            int(run.trace_id, 16),
            int(run.span_id, 16),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    )
    attributes = {
        "agenttest.run.id": end.run_id,
        "agenttest.case.id": end.case_id,
        "agenttest.case.status": end.status,
        "agenttest.case.turns": end.turns,
    }
    token = _PRESET.set(SpanIds(trace.trace_id, trace.span_id))
    try:
        span = tracer.start_span(
            "agenttest.conversation",
            context=_no_parent(),
            attributes=attributes,
            links=[link],
            start_time=trace.started_ns,
        )
    finally:
        _PRESET.reset(token)
    _assertion_events(span, end.final_assertions, final=True)
    if end.error:
        _error_status(span, end.error)
    span.end()


def end_run(run_id: str, started_ns: int, attributes: dict[str, Any]) -> None:
    """Emit a run's span (a trace of its own; its conversations link to it)."""
    tracer = _tracer()
    if tracer is None:
        return
    token = _PRESET.set(run_span_ids(run_id))
    try:
        span = tracer.start_span(
            "agenttest.run",
            context=_no_parent(),
            attributes={"agenttest.run.id": run_id, **attributes},
            start_time=started_ns,
        )
    finally:
        _PRESET.reset(token)
    span.end()


def _no_parent() -> Any:
    """A context without a span: a root span, whatever is current."""
    from opentelemetry.context import Context

    return Context()
