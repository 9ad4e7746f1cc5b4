"""Continuing turns played without reading their conversation (driver/continuing.py).

A worker that saved a conversation's step keeps its state; the next turn of that
conversation, delivered to the same process for the first time, plays on it without
the read every turn otherwise starts with, and its save checks what the read would
have: that nothing wrote the conversation since and that the run is not cancelled.
Shown against a real Postgres store and an agent over HTTP, through the fleet's own
step (`loop_step.run_step`), its store calls run inline instead of on the pool's
threads. Whatever path each turn takes, the conversation ends with the same record.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agent_servers import AgentServer
from test_state_cache import (
    TURNS,
    _case,
    _comparable,
    _reply,
    _row,
    _run,
    play_turn_2_elsewhere,
)

from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
from agenttest_worker.driver.step import Advance, PoolCache
from agenttest_worker.engine import RunOptions
from agenttest_worker.settings import get_settings
from agenttest_worker.store import runs, steps, usage
from agenttest_worker.store.base import SqlStore
from agenttest_worker.store.kept_states import KEPT


@pytest.fixture
def agent() -> Any:
    with AgentServer() as server:
        server.respond("/v1/chat/completions", _reply)
        yield server


class CountingStore(SqlStore):
    """A Postgres store that counts the conversations it was asked to read."""

    reads = 0

    def load_case(self, *args: Any, **kwargs: Any) -> steps.LoadedCase | None:
        self.reads += 1
        return super().load_case(*args, **kwargs)


def _step(store: SqlStore, run_id: str, turn: int, *, redelivered: bool = False) -> Advance:
    from agenttest_worker.agents.exchange import close_session

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


def test_a_continuing_turn_is_played_without_reading_its_conversation(
    pg_database: str, agent: AgentServer
) -> None:
    reference = _reference(pg_database, agent)
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    _play_from(store, run_id, 1)
    assert store.reads == 1, "only the first turn reads the conversation"
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(reference)


def test_a_redelivered_turn_reads_its_conversation(pg_database: str, agent: AgentServer) -> None:
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, 1).next_turn == 2
    assert _step(store, run_id, 2, redelivered=True).next_turn == 3
    assert store.reads == 2
    # And the state it saved is kept as usual: the next first delivery reads nothing.
    assert _step(store, run_id, 3).next_turn == 4
    assert store.reads == 2


def test_a_state_kept_longer_ago_than_half_the_stall_period_is_read_first(
    pg_database: str, agent: AgentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper publishes a turn again once its run has not moved for
    AGENTTEST_STALL_SECONDS: a state kept that long ago may be a turn's that another
    worker has played since, which only the read can tell."""
    monkeypatch.setenv("AGENTTEST_STALL_SECONDS", "2")
    get_settings.cache_clear()
    try:
        store = CountingStore(pg_database)
        run_id = _run(pg_database, agent)
        assert _step(store, run_id, 1).next_turn == 2
        time.sleep(1.2)  # past half the stall period
        assert _step(store, run_id, 2).next_turn == 3
        assert store.reads == 2
        assert _step(store, run_id, 3).next_turn == 4  # kept just now: not read
        assert store.reads == 2
    finally:
        get_settings.cache_clear()


def test_a_run_with_a_budget_reads_every_turn(pg_database: str, agent: AgentServer) -> None:
    """Its turns reserve against the run's totals as the read finds them."""
    from agenttest_submit.runner import store_run
    from agenttest_worker.agents.config import ProjectConfig
    from agenttest_worker.cases.model import Case

    config = ProjectConfig.model_validate(
        {"agents": {"bot": {"base_url": agent.url("/v1"), "model": "m", "max_retries": 0}}}
    )
    run_id, _ = store_run(
        pg_database,
        [Case.model_validate(_case("K1"))],
        options=RunOptions(target="bot", interactive=False, max_tokens=1_000_000),
        config=config,
        target="bot",
        label="budgeted",
    )
    store = CountingStore(pg_database)
    _play_from(store, run_id, 1)
    assert store.reads == TURNS


def test_a_continuing_turn_of_a_cancelled_run_is_not_recorded(
    pg_database: str, agent: AgentServer
) -> None:
    """The run is cancelled while the conversation waits for its turn 2: that turn is
    played on what was kept (its agent called), its save refused, and the conversation
    then ends skipped as any turn of a cancelled run does, with turn 1 alone recorded.
    The calls it made count in the run's usage, outside the records."""
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, 1).next_turn == 2
    assert store.cancel_run(run_id, "stopped by a test")
    calls_before = len(agent.requests("/v1/chat/completions"))

    advance = _step(store, run_id, 2)
    assert advance.saved and advance.case_done and advance.status == "skipped"
    # Turn 2 calls its agent twice: its reply asks for a (mocked) tool first.
    made = len(agent.requests("/v1/chat/completions")) - calls_before
    assert made == 2
    assert store.reads == 2  # turn 1's, and the one after the refused save
    _, result, _ = _row(pg_database, run_id)
    assert result["status"] == "skipped" and result["skip_reason"] == "stopped by a test"
    assert [t["turn"] for t in result["turns"]] == [1]
    run = runs.get_run(pg_database, run_id)
    assert run is not None
    assert usage.stored_usage(run.usage)["target"].calls == made
    assert KEPT.token(run_id, "K1") is None


def test_a_continuing_turn_recorded_elsewhere_is_played_once_more_and_discarded(
    pg_database: str, agent: AgentServer
) -> None:
    """Turn 2 is played by another process while this one keeps turn 1's state; a copy
    of turn 2's message then comes here: played on the kept state, refused (the row
    moved on), and nothing more. Turn 3 here reads what the store holds."""
    reference = _reference(pg_database, agent)
    store = CountingStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, 1).next_turn == 2
    play_turn_2_elsewhere(pg_database, run_id)

    copy = _step(store, run_id, 2)
    assert not copy.saved and copy.next_turn is None
    assert store.reads == 2
    _play_from(store, run_id, 3)
    assert store.reads == 3  # turn 3 read the store; turns 4 and 5 continued
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(reference)
