"""Turns of a history-based agent: each turn's reply read from the agent's chat history.

The agent declares `history:` (agents/protocols/chat_history.py reads and splits it). With
`when: turn` the history is read after every turn and the turn gets its last round;
with `when: end` it is read once, after the last static turn, and every turn not yet
read gets its round then: the turns' assertions wait for it (turn.py). The k-th turn
played is the k-th input of the history counted from its end, so a history that also
holds earlier conversations of the session still lines up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agenttest_worker.agents.interface import AgentError, AgentRequest, HistoryRound, HistorySource
from agenttest_worker.cases.case_model import Case
from agenttest_worker.engine.state import ConversationState
from agenttest_worker.results import AgentCallRecord, TurnResult


@dataclass
class ReadTurn:
    """A turn given its round: the turn, its static index (for its assertions) and the
    conversation as it stood after it (what its judges read)."""

    turn: TurnResult
    static_index: int | None
    messages: list[dict[str, Any]]


def _user_positions(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, message in enumerate(messages) if message.get("role") == "user"]


def _apply(state: ConversationState, turn: TurnResult, round_: HistoryRound, at: int) -> None:
    """Give `turn` its round; the assistant message after its input says the same."""
    turn.output = round_.content or ""
    turn.events = round_.events
    turn.tool_calls = round_.tool_calls
    if round_.tool_results:
        turn.tool_results = {**(turn.tool_results or {}), **round_.tool_results}
        state.tool_results.update(round_.tool_results)
    if round_.problems:
        turn.problems = [*(turn.problems or []), *round_.problems]
    follows = at + 1
    if follows < len(state.messages) and state.messages[follows].get("role") == "assistant":
        state.messages[follows] = {"role": "assistant", "content": turn.output}
    else:
        state.messages.insert(follows, {"role": "assistant", "content": turn.output})


async def read_rounds(
    case: Case,
    state: ConversationState,
    source: HistorySource,
    request: AgentRequest,
    current: TurnResult,
    log: list[AgentCallRecord],
) -> list[ReadTurn]:
    """Fetch the history and give its rounds to the turns still waiting for theirs
    (`current`, and with `when: end` the earlier ones); the fetch is logged as a call.

    A turn the history has no round for gets a problem saying so (it fails; the
    conversation goes on). Raises AgentError when the history cannot be read.
    """
    try:
        read = await source.fetch_history(request)
    except AgentError as exc:
        if exc.call is not None:
            exc.call.error = exc.call.error or exc.message
            exc.call.reply = exc.call.reply or exc.raw
            log.append(exc.call)
        raise
    if read.call is not None:
        log.append(read.call)
    played = [t for t in state.turns if t.input is not None]
    static = _static_indexes(case, [*played, current])
    positions = _user_positions(state.messages)
    waiting = [
        (index, turn)
        for index, turn in enumerate([*played, current])
        if turn is current or (source.history_when == "end" and turn.events is None)
    ]
    rounds: list[HistoryRound | None] = list(read.rounds[-len(waiting) :])
    missing = len(waiting) - len(rounds)
    rounds = [*rounds, *([None] * missing)]
    out: list[ReadTurn] = []
    for (index, turn), round_ in zip(waiting, rounds, strict=True):
        if round_ is None:
            turn.events = []
            turn.problems = [
                *(turn.problems or []),
                f"the chat history has {len(read.rounds)} rounds for {len(played) + 1} "
                "inputs: no reply read for this turn",
            ]
        elif index < len(positions):
            _apply(state, turn, round_, positions[index])
        after = positions[index + 1] if index + 1 < len(positions) else len(state.messages)
        out.append(ReadTurn(turn, static[index], list(state.messages[:after])))
    return out


def _static_indexes(case: Case, turns: list[TurnResult]) -> list[int | None]:
    """Each played turn's index in case.turns (static turns are sent first, in order)."""
    out: list[int | None] = []
    seen = 0
    for turn in turns:
        if turn.input_source == "static" and seen < len(case.turns):
            out.append(seen)
            seen += 1
        else:
            out.append(None)
    return out


def more_static(case: Case, static_index: int | None) -> bool:
    """Whether a static turn follows the one at `static_index`."""
    return static_index is not None and static_index + 1 < len(case.turns)
