"""The engine: one turn of one conversation, the whole test logic, with no Celery and no
database (a test checks that importing it pulls in neither).

The engine is a step function over a serializable ConversationState:

    state = start_conversation(case, session_id)
    while state.phase == "ready":
        state = await run_turn(case, state, pool, options)
    # phase "awaiting_human": call give_human_input(...) with the person's reply or None

A turn sends the pending input with the history to the target, answers tool calls
from `tool_mocks` within the turn, detects whether the agent awaits input, runs the
turn's assertions and chooses the next input: the next static turn (always sent, in
order), else - when the agent awaits input - the simulator, then a person
(interactive), then `on_missing_input`. Limits, errors and statuses follow DESIGN.md.

Modules, in the order a turn uses them: `state` (the data), `turn` (one turn),
`awaiting` (does the reply ask for input?), `end_state` (the state the agent left in
its system, read after a turn or the conversation), `documents` (what json_path and
type assertions read), `assess` (running assertions), `next_input` (what comes next),
`outcome` (final assertions and the case's record).
"""

from agenttest_worker.engine.assess import grade_turn, run_assertions
from agenttest_worker.engine.next_input import apply_missing_input, give_human_input, wants_human
from agenttest_worker.engine.outcome import (
    USAGE_ROLE,
    case_result,
    final_context,
    finish,
    tokens_cost,
    usage_by_role,
)
from agenttest_worker.engine.state import (
    MAX_TOOL_ROUNDS,
    MISSING_INPUT_HINT,
    NO_NEXT_TURN,
    ConversationState,
    HumanPrompt,
    PendingInput,
    Phase,
    RunOptions,
    start_conversation,
)
from agenttest_worker.engine.turn import run_turn, target_for, user_message

__all__ = [
    "MAX_TOOL_ROUNDS",
    "MISSING_INPUT_HINT",
    "NO_NEXT_TURN",
    "USAGE_ROLE",
    "ConversationState",
    "HumanPrompt",
    "PendingInput",
    "Phase",
    "RunOptions",
    "apply_missing_input",
    "case_result",
    "final_context",
    "finish",
    "give_human_input",
    "grade_turn",
    "run_assertions",
    "run_turn",
    "start_conversation",
    "target_for",
    "tokens_cost",
    "usage_by_role",
    "user_message",
    "wants_human",
]
