"""A step's spans: its turn's, around the engine's step, and its conversation's once
the step that ends it is recorded (observe/tracing.py has the design).

The turn's span is started as the child of the conversation's span whose ids the state
keeps, so a conversation played on several workers is one trace; the conversation's
span is emitted by the step that records its end, with the start its state kept. While
the turn is played, its trace assertions read the spans its agent sent from `spans`
(observe/received_spans.py)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from agenttest_worker.engine import ConversationState
from agenttest_worker.observe import received_spans, tracing
from agenttest_worker.observe.received_spans import SpanReader
from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings


class _Loaded(Protocol):
    @property
    def run_id(self) -> str: ...


class _Playing(Protocol):
    """The step's Prepared (driver/step.py), as far as its spans read it."""

    @property
    def loaded(self) -> _Loaded: ...
    @property
    def state(self) -> ConversationState: ...
    @property
    def turn(self) -> int: ...


async def traced_turn(
    prepared: _Playing,
    work: Coroutine[Any, Any, ConversationState],
    spans: SpanReader | None,
) -> ConversationState:
    """`work` (the engine's step on the prepared state, not yet started) played in its
    turn's span. A conversation's first turn draws its trace."""
    state, run_id, turn = prepared.state, prepared.loaded.run_id, prepared.turn
    if state.trace is None:
        state.trace = tracing.new_conversation_trace(run_id)
    trace = state.trace
    view = received_spans.TurnTrace(trace.trace_id, turn, spans, get_settings().trace_wait)
    entered = received_spans.enter_turn(view)
    try:
        with tracing.turn_span(trace, run_id, state.case_id, turn) as span:
            played = await work
            span.finish([result for result in played.turns if result.turn >= turn])
    finally:
        received_spans.leave_turn(entered)
    if played.trace is None:
        # A turn cut at the run's deadline ends the state as stored before it.
        played.trace = trace
    return played


def conversation_ended(run_id: str, state: ConversationState, result: CaseResult) -> None:
    """Emit the conversation's span, once the step that ends it is recorded."""
    if state.trace is None:
        return  # ended before any turn was played: no trace was drawn
    end = tracing.ConversationEnd(
        run_id=run_id,
        case_id=state.case_id,
        status=result.status,
        error=state.error,
        final_assertions=state.final_assertions,
        turns=state.turns_run,
    )
    tracing.end_conversation(state.trace, end)
