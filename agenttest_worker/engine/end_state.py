"""End state: the state an agent left in its system, read from its `state:` URL after
the conversation and, with `each_turn: true`, after every turn (agents/state_fetch.py
makes the call through the agents' HTTP transport).

What is read is kept in the conversation's state (`end_state`), so that whichever
worker plays the next step sees it, and on the records: a turn's (`end_state`) and the
case's. The documents json_path and type assertions read hold it as `state`
(engine/documents.py). A state that cannot be read fails the case with the reason,
as an infrastructure error: the agent's replies say nothing of it.
"""

from __future__ import annotations

from typing import Any

from agenttest_worker.agents.interface import AgentError
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.agents.state_endpoint import StateEndpoint
from agenttest_worker.agents.state_fetch import INFRASTRUCTURE, StateCall, fetch_state
from agenttest_worker.cases.case_model import Case
from agenttest_worker.engine.state import ConversationState
from agenttest_worker.results import TurnResult


def endpoint_of(case: Case, pool: AgentPool, agent: str | None) -> StateEndpoint | None:
    """The case's `state:`, else its target agent entry's; None when neither has one."""
    if case.state is not None:
        return case.state
    entry = pool.config.agents.get(agent.removeprefix("agents:")) if agent else None
    return entry.state if entry is not None else None


def last_target(state: ConversationState) -> str | None:
    """The agent the conversation's last played turn was sent to (its call records say)."""
    for turn in reversed(state.turns):
        for call in reversed(turn.calls or []):
            if call.role == "target":
                return call.agent
    return None


async def _read(
    endpoint: StateEndpoint,
    case: Case,
    state: ConversationState,
    pool: AgentPool,
    agent: str,
    turn: int,
) -> Any:
    ident = agent.removeprefix("agents:")
    try:
        config = pool.config.agent(ident)
    except LookupError as exc:
        raise AgentError("state", f"{INFRASTRUCTURE}: cannot read the end state: {exc}") from None
    call = StateCall(
        agent=ident,
        config=config,
        project=pool.config,
        session_id=state.session_id,
        case_id=case.id,
        turn=turn,
        from_case=case.state is not None,
    )
    found = await fetch_state(endpoint, call)
    state.end_state = found
    return found


async def after_turn(
    case: Case, state: ConversationState, pool: AgentPool, agent: str, turn: TurnResult
) -> str | None:
    """With `each_turn: true`, the state read onto `turn` (before its assertions run);
    the reason when it cannot be read, else None."""
    endpoint = endpoint_of(case, pool, agent)
    if endpoint is None or not endpoint.each_turn:
        return None
    try:
        turn.end_state = await _read(endpoint, case, state, pool, agent, turn.turn)
    except AgentError as exc:
        return exc.message
    return None


async def at_end(case: Case, state: ConversationState, pool: AgentPool) -> None:
    """After the conversation (before its final assertions): the state read into the
    conversation's; when it cannot be read the case fails with the reason (`error`)."""
    agent = last_target(state) or case.agent
    endpoint = endpoint_of(case, pool, agent)
    if endpoint is None:
        return
    if agent is None:
        state.error = f"{INFRASTRUCTURE}: cannot read the end state: no target agent played a turn"
        return
    try:
        await _read(endpoint, case, state, pool, agent, state.turns_run)
    except AgentError as exc:
        state.error = exc.message


def turn_document_with_state(document: Any, turn: TurnResult) -> Any:
    """A turn's document with the state read after it as `state` (an object document
    only: a reply that is a JSON array or scalar has no key to hold it)."""
    if turn.end_state is None or not isinstance(document, dict):
        return document
    return {**document, "state": turn.end_state}
