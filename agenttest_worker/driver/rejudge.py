"""Re-evaluation: run a case's (possibly changed) assertions on a stored conversation.

No target agent is called: every turn's output, tool calls and the history come from
the stored state; judges and scripts run again. Turn k of the stored conversation is
judged by the case's static turn k when that turn was static (simulated and
interactive turns have no assertions of their own); final assertions run again when
the conversation had completed (no error, not skipped).
"""

from __future__ import annotations

from typing import Any

from agenttest_worker.agents.options import merge_options
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.assertions import Assertion, AssertionContext
from agenttest_worker.cases.case_model import Case
from agenttest_worker.engine import (
    ConversationState,
    final_context,
    grade_turn,
    run_assertions,
)
from agenttest_worker.engine.documents import turn_document
from agenttest_worker.results import AgentCallRecord, TurnResult, Usage


def _history_through(messages: list[dict[str, Any]], turn_index: int) -> list[dict[str, Any]]:
    """The messages up to the reply of executed turn `turn_index` (0-based)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    end = users[turn_index + 1] if turn_index + 1 < len(users) else len(messages)
    return messages[:end]


def _completed(state: ConversationState) -> bool:
    return (
        state.error is None and state.skip_reason is None and not any(t.error for t in state.turns)
    )


async def reevaluate(case: Case, stored: ConversationState, pool: AgentPool) -> ConversationState:
    state = stored.model_copy(deep=True)
    ran = [t for t in state.turns if t.input is not None]
    for index, turn in enumerate(ran):
        static = turn.input_source == "static" and index < len(case.turns)
        assertions: list[Assertion] = list(case.turns[index].assertions) if static else []
        if turn.error is not None:
            continue  # no reply to judge; the turn stays failed with its error
        log: list[AgentCallRecord] = []
        turn_options = case.turns[index].options if static else None
        ctx = AssertionContext(
            output=turn.output,
            document=turn_document(turn.output, turn.tool_calls),
            tool_calls=turn.tool_calls,
            input=turn.input,
            messages=_history_through(state.messages, index),
            final=False,
            case_id=case.id,
            metadata=dict(merge_options(case.options, turn_options).metadata),
            roles=pool.session(log),
        )
        grade_turn(turn, await run_assertions(assertions, ctx))
        # The judges' calls of this re-evaluation replace the stored ones (the target's
        # and simulator's stay: they made the conversation), and usage follows them.
        kept = [c for c in (turn.calls or []) if c.role != "validator"]
        _record_calls(turn, [*kept, *log])
    if _completed(state):
        log = []
        ctx = final_context(case, state, pool.session(log))
        state.final_assertions = await run_assertions(list(case.final_assertions), ctx)
        if log and ran:
            # As a played conversation keeps them (engine/outcome.py): with the last
            # turn, every vote of a final judge counted in the case's usage.
            _record_calls(ran[-1], [*(ran[-1].calls or []), *log])
    return state


def _record_calls(turn: TurnResult, calls: list[AgentCallRecord]) -> None:
    turn.calls = calls or None
    usage = [c.usage for c in calls if c.usage is not None]
    turn.usage = sum(usage, Usage()) if usage else None
