"""Kept states and turn records (driver/state_cache.py) against a real Postgres store.

A worker keeps the state of each step it saves; the next turn of that conversation, if
it comes to the same process and nothing else wrote the conversation since, is played
on the kept state without the store sending it. The stored state holds only the last
turn while the conversation runs, the earlier turns' results being rows of their own.
Whatever the path (kept, read back from the store, or whole as before), a conversation
ends with the same record, and any worker can play any turn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_servers import AgentServer, Received, Reply, completion, tool_call
from sqlalchemy import select

from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.kept_states import KEPT
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow, TurnRecordRow

TURNS = 5


def _reply(request: Received) -> Reply:
    """The n-th user message gets "reply n"; the second asks for a (mocked) tool first."""
    messages = request.json["messages"]
    users = sum(1 for m in messages if m["role"] == "user")
    usage = {"prompt_tokens": 7 * users, "completion_tokens": 3, "total_tokens": 7 * users + 3}
    if users == 2 and messages[-1]["role"] == "user":
        return Reply(body=completion(None, tool_calls=[tool_call("lookup", {"q": 2})], usage=usage))
    return Reply(body=completion(f"reply {users}: " + "words " * 40, usage=usage))


@pytest.fixture
def agent() -> Any:
    with AgentServer() as server:
        server.respond("/v1/chat/completions", _reply)
        yield server


def _case(case_id: str) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [
        {
            "input": f"message {n}",
            "assertions": [
                {"type": "contains", "value": f"reply {n}"},
                {"type": "regex", "pattern": "^reply [0-9]+"},
            ],
        }
        for n in range(1, TURNS + 1)
    ]
    turns[1]["tool_mocks"] = {"lookup": {"found": 2, "items": ["a", "b"]}}
    turns[1]["assertions"].append({"type": "tool_called", "name": "lookup"})
    # Read at the end, over every turn: the earlier ones must be back by then.
    final = [
        {"type": "json_path", "path": "$.turns[0].content", "value": "reply 1: " + "words " * 40},
        {"type": "json_path", "path": f"$.turns[{TURNS - 1}].content"},
    ]
    return {"id": case_id, "turns": turns, "final_assertions": final}


def _run(database_url: str, agent: AgentServer, case_id: str = "K1") -> str:
    from agenttest_submit.run.runner import store_run
    from agenttest_worker.agents.config import ProjectConfig
    from agenttest_worker.cases.case_model import Case
    from agenttest_worker.engine import RunOptions

    config = ProjectConfig.model_validate(
        {"agents": {"bot": {"base_url": agent.url("/v1"), "model": "m", "max_retries": 0}}}
    )
    run_id, _ = store_run(
        database_url,
        [Case.model_validate(_case(case_id))],
        options=RunOptions(target="bot", interactive=False),
        config=config,
        target="bot",
        label="kept states",
    )
    return run_id


def _step(store: SqlStore, run_id: str, case_id: str, turn: int) -> Any:
    import asyncio

    from agenttest_worker.agents.http.exchange import close_session
    from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
    from agenttest_worker.driver.step import PoolCache

    async def step() -> Any:
        try:
            at = TurnAddress(run_id, case_id, turn, 3)
            return await run_step(store, PoolCache(), at, inline)
        finally:
            await close_session()

    return asyncio.run(step())


def _play(store: SqlStore, run_id: str, case_id: str = "K1", *, kept: bool = True) -> None:
    turn: int | None = 1
    while turn is not None:
        if not kept:
            KEPT.clear()  # as if each turn went to another worker
        advance = _step(store, run_id, case_id, turn)
        assert advance.saved, advance
        turn = advance.next_turn


def _row(database_url: str, run_id: str, case_id: str = "K1") -> tuple[Any, Any, int]:
    """(state, result, turn records) as stored."""
    with session_scope(database_url) as session:
        state, result = session.execute(
            select(CaseRow.state, CaseRow.result).where(
                CaseRow.run_id == run_id, CaseRow.case_id == case_id
            )
        ).one()
        records = session.execute(
            select(TurnRecordRow.position).where(
                TurnRecordRow.run_id == run_id, TurnRecordRow.case_id == case_id
            )
        ).all()
    return state, result, len(records)


def _three_turns_read_back(
    store: SqlStore, database_url: str, agent: AgentServer
) -> tuple[str, steps.LoadedCase]:
    """A new run whose K1 played three turns, and K1 as a worker that kept nothing
    reads it."""
    run_id = _run(database_url, agent)
    for turn in (1, 2, 3):
        _step(store, run_id, "K1", turn)
    KEPT.clear()
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None
    return run_id, loaded


def _comparable(result: Any) -> str:
    """The record as JSON text, minus what differs between two plays (times, the trace
    drawn for it) and the run it was played in."""
    volatile = {"duration_ms", "latency_ms", "response_ms", "first_token_ms", "trace_id"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in volatile}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(result))


class WholeStore(SqlStore):
    """A store without turn records: every state saved whole, as before they existed."""

    keeps_turn_records = False


class FailingOnce(SqlStore):
    """A store whose first save after `arm()` fails as a lost database would."""

    armed = False

    def save_step(self, step: steps.Step) -> steps.Saved:
        if self.armed:
            self.armed = False
            raise ConnectionError("database gone")
        return super().save_step(step)


def test_every_path_ends_with_the_same_record(pg_database: str, agent: AgentServer) -> None:
    """Kept states, states read back from compact rows every turn, and whole states
    as before give the same record, down to the order of every key."""
    store = SqlStore(pg_database)
    kept_run = _run(pg_database, agent)
    _play(store, kept_run)
    read_run = _run(pg_database, agent)
    _play(store, read_run, kept=False)
    whole_run = _run(pg_database, agent)
    _play(WholeStore(pg_database), whole_run, kept=False)

    records = [_row(pg_database, run)[1] for run in (kept_run, read_run, whole_run)]
    assert records[0]["status"] == "passed" and len(records[0]["turns"]) == TURNS
    assert _comparable(records[0]) == _comparable(records[1]) == _comparable(records[2])
    # The whole state is stored at the end, as every reader of a finished case expects.
    for run in (kept_run, read_run):
        state, _, records_left = _row(pg_database, run)
        assert "earlier_turns" not in state and len(state["turns"]) == TURNS
        assert "earlier_messages" not in state
        assert records_left == 0
    # And every message, in order, whichever path: the whole conversation's.
    conversations = [
        _row(pg_database, run)[0]["messages"] for run in (kept_run, read_run, whole_run)
    ]
    assert conversations[0] == conversations[1] == conversations[2]
    assert [m["content"] for m in conversations[0] if m["role"] == "user"] == [
        f"message {n}" for n in range(1, TURNS + 1)
    ]


def test_a_running_conversation_stores_only_its_last_turn_in_its_state(
    pg_database: str, agent: AgentServer
) -> None:
    store = SqlStore(pg_database)
    run_id = _run(pg_database, agent)
    for turn in (1, 2, 3):
        assert _step(store, run_id, "K1", turn).next_turn == turn + 1
    state, _, records = _row(pg_database, run_id)
    assert state["earlier_turns"] == 2 and [t["turn"] for t in state["turns"]] == [3]
    assert records == 2
    # Its messages too are stored with the records, each once: the state holds none of
    # the 8 so far (turn 2 called a tool: its user message, the call, the tool's result
    # and the reply), and the stored state does not grow with the conversation.
    assert state["earlier_messages"] == 8 and state["messages"] == []
    with session_scope(pg_database) as session:
        chunks = session.execute(
            select(TurnRecordRow.messages)
            .where(TurnRecordRow.run_id == run_id)
            .order_by(TurnRecordRow.position)
        ).scalars()
        stored = [m for chunk in chunks if chunk for m in json.loads(f"[{chunk}]")]
    roles = ["user", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [m["role"] for m in stored] == roles
    assert [m["content"] for m in stored if m["role"] == "user"] == [
        "message 1",
        "message 2",
        "message 3",
    ]
    # The next load finds the row as this process saved it: the state is not sent.
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None and loaded.state_kept and loaded.state is None
    # Another process knows nothing kept: it gets the state and the records.
    KEPT.clear()
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None and not loaded.state_kept and loaded.state is not None
    assert loaded.turn_records is not None and len(json.loads(loaded.turn_records)) == 2
    assert loaded.turn_messages is not None and json.loads(loaded.turn_messages) == stored


def test_another_worker_plays_the_next_turn_after_this_one_kept_it(
    pg_database: str, agent: AgentServer
) -> None:
    """Turn 2 is played by another process while this one keeps turn 1's state: turn 3
    here must be played on what the store holds (turn 2 included), not on the kept one."""
    store = SqlStore(pg_database)
    reference = _run(pg_database, agent)
    _play(store, reference, kept=False)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, "K1", 1).next_turn == 2
    assert KEPT.token(run_id, "K1") is not None
    play_turn_2_elsewhere(pg_database, run_id)
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None and not loaded.state_kept  # turn 2 was written elsewhere
    turn: int | None = 3
    while turn is not None:
        advance = _step(store, run_id, "K1", turn)
        assert advance.saved
        turn = advance.next_turn
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(_row(pg_database, reference)[1])


def play_turn_2_elsewhere(database_url: str, run_id: str) -> None:
    """Turn 2 of K1 played and saved by another process (another worker)."""
    other = subprocess.run(
        [sys.executable, "-c", _OTHER_WORKER, database_url, run_id],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == ["True", "3"]


_OTHER_WORKER = """
import asyncio, sys
from agenttest_worker.agents.http.exchange import close_session
from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
from agenttest_worker.driver.step import PoolCache
from agenttest_worker.store.conversation_store import SqlStore

async def main():
    try:
        at = TurnAddress(sys.argv[2], "K1", 2, 3)
        return await run_step(SqlStore(sys.argv[1]), PoolCache(), at, inline)
    finally:
        await close_session()

advance = asyncio.run(main())
print(advance.saved, advance.next_turn)
"""


def test_a_failed_save_keeps_nothing(pg_database: str, agent: AgentServer) -> None:
    """The state a turn played on was updated in place: after a save that failed, the
    next copy of the turn must read the state from the store, not find that one."""
    store = FailingOnce(pg_database)
    reference = _run(pg_database, agent)
    _play(SqlStore(pg_database), reference)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, "K1", 1).next_turn == 2
    store.armed = True
    with pytest.raises(ConnectionError):
        _step(store, run_id, "K1", 2)
    assert KEPT.token(run_id, "K1") is None
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None and not loaded.state_kept and loaded.next_turn == 2
    turn: int | None = 2  # the broker gives the turn back
    while turn is not None:
        advance = _step(store, run_id, "K1", turn)
        assert advance.saved
        turn = advance.next_turn
    assert _comparable(_row(pg_database, run_id)[1]) == _comparable(_row(pg_database, reference)[1])


def test_a_duplicate_of_a_kept_turn_changes_nothing(pg_database: str, agent: AgentServer) -> None:
    """Two copies of one turn in the same process: the first takes the kept state, the
    second reads the store's; one of them is saved, the other changes nothing."""
    from agenttest_worker.driver.step import Prepared, commit, end_without_running, prepare

    store = SqlStore(pg_database)
    run_id = _run(pg_database, agent)
    assert _step(store, run_id, "K1", 1).next_turn == 2
    first = prepare(store, run_id, "K1", 2, 3)
    second = prepare(store, run_id, "K1", 2, 3)
    assert isinstance(first, Prepared) and isinstance(second, Prepared)
    assert first.state is not second.state
    assert first.state.model_dump_json() == second.state.model_dump_json()
    assert commit(store, second, end_without_running(second, "fail", "stopped")).saved
    assert not commit(store, first, end_without_running(first, "skip", "late copy")).saved
    assert KEPT.token(run_id, "K1") is None  # the case ended: nothing to keep
    state, result, records = _row(pg_database, run_id)
    assert result["status"] == "failed" and state["error"] == "stopped" and records == 0


def test_a_turn_holds_its_case_and_state_parsed_not_as_text(
    pg_database: str, agent: AgentServer
) -> None:
    """A turn waits on its agent holding what it plays on, validated and parsed; the
    texts they came from are dropped (thousands of turns wait on one worker), the case's
    too, and the turn still plays to the same record."""
    import asyncio

    from agenttest_worker.agents.http.exchange import close_session
    from agenttest_worker.driver.step import PoolCache, Prepared, commit, execute, prepare

    store = SqlStore(pg_database)
    run_id = _run(pg_database, agent)
    for turn in (1, 2):
        KEPT.clear()  # the second turn reads its state from the store
        prepared = prepare(store, run_id, "K1", turn)
        assert isinstance(prepared, Prepared)
        assert prepared.loaded.case == "" and prepared.loaded.state is None
        assert prepared.loaded.turn_records is None
        assert prepared.case.id == "K1" and len(prepared.case.turns) == TURNS

        async def play(prepared: Prepared = prepared) -> Any:
            try:
                pool = PoolCache().for_run(run_id, prepared.loaded.run_config)
                return await execute(prepared, pool)
            finally:
                await close_session()

        advance = commit(store, prepared, asyncio.run(play()))
        assert advance.saved and advance.next_turn == turn + 1
    turn_now: int | None = 3
    while turn_now is not None:
        turn_now = _step(store, run_id, "K1", turn_now).next_turn
    assert _row(pg_database, run_id)[1]["status"] == "passed"


def test_a_conversation_between_steps_holds_its_earlier_turns_as_text(
    pg_database: str, agent: AgentServer
) -> None:
    """Kept or read back, a conversation's state holds only its last turn as an object:
    the earlier ones stay the text they were stored as until its end, which reads them
    (its final assertions over every turn pass, its record lists them all)."""
    from agenttest_worker.driver import state_cache

    store = SqlStore(pg_database)
    run_id = _run(pg_database, agent)
    for turn in (1, 2, 3):
        assert _step(store, run_id, "K1", turn).next_turn == turn + 1
    token = KEPT.token(run_id, "K1")
    assert token is not None
    kept = KEPT.take(run_id, "K1", token).stored
    state = kept.state
    assert kept.archived == state.earlier_turns == 2 and state.earlier_run == 2
    assert [t.turn for t in state.turns] == [3] and state.turns_run == 3
    texts = [t for text in state.earlier_records for t in json.loads(text)]
    assert [t["turn"] for t in texts] == [1, 2] and texts[0]["output"].startswith("reply 1")
    # Read back by a process that kept nothing: the records' text, unparsed.
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None and not loaded.state_kept
    read = state_cache.parse(loaded)
    assert read.state.earlier_records == (loaded.turn_records,)
    assert [t.turn for t in read.state.turns] == [3] and read.state.turns_run == 3
    read.state.restore_turns()
    assert [t.turn for t in read.state.turns] == [1, 2, 3]
    assert read.state.earlier_turns is None and read.state.earlier_records == ()
    # Played on from there (kept again after each step), it ends with every turn.
    turn: int | None = 4
    while turn is not None:
        turn = _step(store, run_id, "K1", turn).next_turn
    _, record, records_left = _row(pg_database, run_id)
    assert record["status"] == "passed", record
    assert [t["turn"] for t in record["turns"]] == list(range(1, TURNS + 1))
    assert all(a["passed"] for a in record["final_assertions"]) and records_left == 0


def test_a_state_stored_before_it_counted_its_earlier_turns_is_read_back_whole(
    pg_database: str, agent: AgentServer
) -> None:
    """A compact state stored without `earlier_run` (by an earlier version) gets its
    turns back at once, and plays on to the same record."""
    from agenttest_worker.driver import state_cache

    store = SqlStore(pg_database)
    run_id = _run(pg_database, agent)
    for turn in (1, 2, 3):
        _step(store, run_id, "K1", turn)
    KEPT.clear()
    with session_scope(pg_database) as session:
        row = session.execute(select(CaseRow).where(CaseRow.run_id == run_id)).scalar_one()
        stored = dict(row.state)
        stored.pop("earlier_run")
        row.state = stored
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None
    read = state_cache.parse(loaded)
    assert [t.turn for t in read.state.turns] == [1, 2, 3] and read.state.earlier_turns is None
    assert read.archived == 2
    turn: int | None = 4
    while turn is not None:
        turn = _step(store, run_id, "K1", turn).next_turn
    _, record, _ = _row(pg_database, run_id)
    assert record["status"] == "passed" and len(record["turns"]) == TURNS


def test_a_state_whose_earlier_turns_did_not_come_back_is_refused(
    pg_database: str, agent: AgentServer
) -> None:
    """Better to stop than to play on, or end, without the earlier turns: a load without
    them is refused at once, and records missing a turn when the end reads them."""
    import dataclasses

    from agenttest_worker.driver import state_cache

    _, loaded = _three_turns_read_back(SqlStore(pg_database), pg_database, agent)
    assert loaded.turn_records is not None
    with pytest.raises(LookupError, match="after the first 2, and no earlier turns"):
        state_cache.parse(dataclasses.replace(loaded, turn_records=None))
    first_only = json.dumps(json.loads(loaded.turn_records)[:1])
    read = state_cache.parse(dataclasses.replace(loaded, turn_records=first_only))
    assert read.state.turns_run == 3  # counted without reading them
    with pytest.raises(LookupError, match="after the first 2, and 1 earlier turns"):
        read.state.restore_turns()
    # Nor without every earlier message: the next call would send half a conversation.
    assert loaded.turn_messages is not None
    with pytest.raises(LookupError, match="messages after the first 8, and 0 earlier messages"):
        state_cache.parse(dataclasses.replace(loaded, turn_messages=None))
    some = json.dumps(json.loads(loaded.turn_messages)[:5])
    with pytest.raises(LookupError, match="messages after the first 8, and 5 earlier messages"):
        state_cache.parse(dataclasses.replace(loaded, turn_messages=some))


def test_a_state_stored_with_every_message_plays_on_and_stores_them_apart(
    pg_database: str, agent: AgentServer
) -> None:
    """A running conversation stored before its messages left its state (every message
    in the state, none with its turn records) is read as it is, and its next step moves
    them all to that step's record: it ends with the same record and conversation."""
    from sqlalchemy import update

    store = SqlStore(pg_database)
    reference = _run(pg_database, agent)
    _play(store, reference)
    run_id, loaded = _three_turns_read_back(store, pg_database, agent)
    assert loaded.turn_messages is not None
    with session_scope(pg_database) as session:
        row = session.execute(select(CaseRow).where(CaseRow.run_id == run_id)).scalar_one()
        stored = dict(row.state)
        assert stored.pop("earlier_messages") == 8
        stored["messages"] = json.loads(loaded.turn_messages)
        row.state = stored
        session.execute(
            update(TurnRecordRow).where(TurnRecordRow.run_id == run_id).values(messages=None)
        )
    assert _step(store, run_id, "K1", 4).next_turn == 5
    state, _, _ = _row(pg_database, run_id)
    assert state["earlier_messages"] == 10 and state["messages"] == []
    KEPT.clear()  # the last turn reads them back from the records
    assert _step(store, run_id, "K1", 5).next_turn is None
    (state, record, _), (whole, expected, _) = (
        _row(pg_database, run_id),
        _row(pg_database, reference),
    )
    assert record["status"] == "passed" and _comparable(record) == _comparable(expected)
    assert state["messages"] == whole["messages"] and len(state["messages"]) == 12


def test_on_sqlite_too_a_conversation_read_back_every_turn_ends_whole(
    tmp_path: Path, agent: AgentServer
) -> None:
    """The same store on SQLite (a resumed embedded run's): its turn records and messages
    come back in order from its own aggregate, every turn read back from the store."""
    from agenttest_worker.store.sql.db import upgrade

    url = f"sqlite:///{tmp_path}/store.db"
    upgrade(url)
    read_run = _run(url, agent)
    _play(SqlStore(url), read_run, kept=False)
    whole_run = _run(url, agent)
    _play(WholeStore(url), whole_run, kept=False)
    (state, record, left), (whole, expected, _) = _row(url, read_run), _row(url, whole_run)
    assert record["status"] == "passed" and _comparable(record) == _comparable(expected)
    assert state["messages"] == whole["messages"] and len(state["messages"]) == 12
    assert "earlier_messages" not in state and left == 0


def test_a_kept_state_let_go_of_between_its_load_and_its_turn_is_read_back_whole(
    pg_database: str, agent: AgentServer
) -> None:
    """The load skipped the state (this process kept it), then the kept state was let go
    of (more conversations in flight than are kept) before the turn took it: the state
    is read again, its earlier messages with it, and the turn plays on the whole
    conversation (it stopped with "0 earlier messages were loaded")."""
    from agenttest_worker.driver import state_cache

    store = SqlStore(pg_database)
    run_id = _run(pg_database, agent)
    for turn in (1, 2, 3):
        assert _step(store, run_id, "K1", turn).saved
    loaded = store.load_case(run_id, "K1")
    assert loaded is not None and loaded.state_kept and loaded.turn_messages is None
    KEPT.clear()  # let go of, as the bound on kept states does
    found = state_cache.load(store, loaded)
    assert found is not None
    _, stored = found
    KEPT.clear()
    whole = store.load_case(run_id, "K1")
    assert whole is not None and not whole.state_kept
    assert stored.state.messages == state_cache.stored(whole).state.messages
    assert stored.state.earlier_messages  # the messages stored apart came back
