"""A turn's message delivered more than once: its agent is called once for that turn.

Every fleet turn reads its conversation before it plays (`step.prepare`), and plays
only a turn the conversation is still waiting for; a worker that kept the state it
saved last (state_cache.py) skips reading that state, never the read itself. Shown
against a real Postgres store and an agent over HTTP, through the fleet's own step
(`loop_step.run_step`), its store calls run inline instead of on the pool's threads.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import pytest
from agent_servers import AgentServer
from test_state_cache import (
    _comparable,
    _reply,
    _row,
    _run,
    play_turn_2_elsewhere,
)

from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
from agenttest_worker.driver.step import Advance, PoolCache
from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.kept_states import KEPT
from agenttest_worker.store.sql import runs, usage

T = TypeVar("T")
CALLS = "/v1/chat/completions"


@pytest.fixture
def agent() -> Any:
    with AgentServer() as server:
        server.respond(CALLS, _reply)
        yield server


class CountingStore(SqlStore):
    """A Postgres store that counts the conversations it was asked to read, and how
    many of those reads skipped the state this process kept."""

    reads = 0
    kept = 0

    def load_case(self, *args: Any, **kwargs: Any) -> steps.LoadedCase | None:
        self.reads += 1
        loaded = super().load_case(*args, **kwargs)
        self.kept += loaded is not None and loaded.state_kept
        return loaded


def _step(store: SqlStore, run_id: str, turn: int, *, redelivered: bool = False) -> Advance:
    """The body of turn `turn`'s task, as the loop pool runs it."""
    from agenttest_worker.agents.http.exchange import close_session

    address = TurnAddress(run_id, "K1", turn, 3, redelivered)
    followed: list[Advance] = []

    async def step() -> Advance:
        try:
            return await run_step(store, PoolCache(), address, inline, followed.append)
        finally:
            await close_session()

    advance = asyncio.run(step())
    assert followed == [advance], "what comes next is handed on once, after the save"
    return advance


def _play_from(store: SqlStore, run_id: str, turn: int | None) -> None:
    while turn is not None:
        advance = _step(store, run_id, turn)
        assert advance.saved, advance
        turn = advance.next_turn


def _reference(pg_database: str, agent: AgentServer) -> Any:
    """The record of the conversation played with every turn read from the store."""
    run_id = _run(pg_database, agent)
    turn: int | None = 1
    while turn is not None:
        KEPT.clear()  # as if each turn went to another worker
        turn = _step(SqlStore(pg_database), run_id, turn).next_turn
    return _row(pg_database, run_id)[1]


def test_every_turn_reads_its_conversation_and_plays_on_the_state_it_kept(
    pg_database: str, agent: AgentServer
) -> None:
    reference = _reference(pg_database, agent)
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    _play_from(store, run_id, 1)
    turns = len(reference["turns"])
    assert store.reads == turns
    assert store.kept == turns - 1, "after the first, each turn's state was the one kept"
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(reference)


@pytest.mark.parametrize("redelivered", [False, True])
def test_a_turn_delivered_twice_calls_its_agent_once(
    pg_database: str, agent: AgentServer, redelivered: bool
) -> None:
    """The same turn task run twice in one worker (a publish retried, or the broker
    giving the message back): the second copy finds the turn recorded, calls nobody,
    records nothing and hands nothing on (a redelivered copy hands on the next turn
    again, which its own guard keeps from doubling)."""
    reference = _reference(pg_database, agent)
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, 1).next_turn == 2
    before = len(agent.requests(CALLS))
    assert _step(store, run_id, 2).next_turn == 3
    # Turn 2 calls its agent twice: its reply asks for a (mocked) tool first.
    assert len(agent.requests(CALLS)) - before == 2

    copy = _step(store, run_id, 2, redelivered=redelivered)
    assert not copy.saved
    assert copy.next_turn == (3 if redelivered else None)
    assert len(agent.requests(CALLS)) - before == 2, "the copy called no agent"
    _play_from(store, run_id, 3)
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(reference)


def test_a_copy_of_a_turn_recorded_by_another_worker_calls_no_agent(
    pg_database: str, agent: AgentServer
) -> None:
    """Turn 2 is played by another process while this one keeps turn 1's state; a copy
    of turn 2's message then comes here: read, found recorded, and nothing more. Turn 3
    here plays on what the store holds."""
    reference = _reference(pg_database, agent)
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, 1).next_turn == 2
    play_turn_2_elsewhere(pg_database, run_id)

    before = len(agent.requests(CALLS))
    copy = _step(store, run_id, 2)
    assert not copy.saved and copy.next_turn is None
    assert len(agent.requests(CALLS)) == before
    _play_from(store, run_id, 3)
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(reference)


def test_a_turn_of_a_cancelled_run_calls_no_agent(pg_database: str, agent: AgentServer) -> None:
    """The run is cancelled while the conversation waits for its turn 2, whose state
    this worker kept: the turn ends the conversation skipped without calling its agent,
    with turn 1 alone recorded."""
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, 1).next_turn == 2
    assert store.cancel_run(run_id, "stopped by a test")
    before = len(agent.requests(CALLS))

    advance = _step(store, run_id, 2)
    assert advance.saved and advance.case_done and advance.status == "skipped"
    assert len(agent.requests(CALLS)) == before
    _, result, _ = _row(pg_database, run_id)
    assert result["status"] == "skipped" and result["skip_reason"] == "stopped by a test"
    assert [t["turn"] for t in result["turns"]] == [1]
    run = runs.get_run(pg_database, run_id)
    assert run is not None
    assert "target" not in usage.stored_usage(run.usage)
    assert KEPT.token(run_id, "K1") is None
