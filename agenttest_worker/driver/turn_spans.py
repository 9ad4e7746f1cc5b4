"""A step's spans: its turn's, around the engine's step, and its conversation's once
the step ends it (observe/tracing.py has the design).

The turn's span is started as the child of the conversation's span whose ids the state
keeps, so a conversation played on several workers is one trace; the conversation's
span is emitted by the step that records its end, with the start its state kept."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from agenttest_worker.engine import ConversationState
from agenttest_worker.observe import tracing
from agenttest_worker.results import CaseResult


async def traced_turn(
    state: ConversationState,
    run_id: str,
    turn: int,
    work: Coroutine[Any, Any, ConversationState],
) -> ConversationState:
    """`work` (the engine's step on `state`, not yet started) played in its turn's span.
    A conversation's first turn draws its trace."""
    if state.trace is None:
        state.trace = tracing.new_conversation_trace()
    trace = state.trace
    with tracing.turn_span(trace, run_id, state.case_id, turn) as span:
        played = await work
        span.finish([result for result in played.turns if result.turn >= turn])
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
