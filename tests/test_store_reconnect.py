"""The hot path and a database that goes away: `reconnecting` retries through a restart
(including while the server is still refusing connections), and a step whose commit
landed just before the connection dropped is recognized as saved by its retry, so its
conversation goes on at once instead of waiting for the stall sweeper.
(The same on a fleet with real restarts: test_faults_fleet.py.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fault_kit import PostgresServer
from fleet import greeting_case, write_project
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from agenttest_submit.run.runner import store_run
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.cases.case_model import Case
from agenttest_worker.driver.event_loops import run_sync
from agenttest_worker.driver.step import Advance, PoolCache, commit, execute, prepare
from agenttest_worker.engine import RunOptions
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.sql import recovery, runs
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql.db import get_engine, is_connection_lost, upgrade


def _stored_run(url: str, demo_url: str, tmp_path: Path, n: int = 1) -> str:
    config = load_config(str(write_project(tmp_path, demo_url)))
    run_id, total = store_run(
        url,
        [Case.model_validate(greeting_case(f"C{i}")) for i in range(n)],
        options=RunOptions(target="slow.expense", interactive=False),
        config=config,
        target="slow.expense",
        label="reconnect",
    )
    runs.start_run(url, run_id, total)
    return run_id


class _FaultyEngine:
    """The store's engine, with a fault injected into its connections (see subclasses).

    Passed to a real SqlStore in place of `get_engine(url)` (`_store_on`): the hot path
    asks it for its dialect and checks its connections out with `raw_connection` and
    back in with their `close`. The fault has to sit below the store, where the hot
    path's own retry (`reconnecting`) and its check for a landed write run."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.dialect = engine.dialect

    def raw_connection(self) -> Any:
        self.checking_out()
        return _Pooled(self.engine.raw_connection(), self.checked_in)

    def checking_out(self) -> None:
        pass

    def checked_in(self) -> None:
        pass


class _Pooled:
    """A pooled connection that tells its engine when it is given back."""

    def __init__(self, pooled: Any, on_close: Any) -> None:
        self.pooled, self.on_close = pooled, on_close
        self.driver_connection = pooled.driver_connection

    @property
    def is_valid(self) -> bool:
        return bool(self.pooled.is_valid)

    def invalidate(self, exc: BaseException | None = None) -> None:
        self.pooled.invalidate(exc)

    def close(self) -> None:
        self.pooled.close()
        self.on_close()


@pytest.fixture(scope="module")
def _private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    with PostgresServer(tmp_path_factory.mktemp("pg")) as pg:
        yield pg


@pytest.fixture
def pg(_private_cluster: PostgresServer) -> PostgresServer:
    """A Postgres server of this module's own, running, for tests that stop and start it
    (one initdb for the module; each test makes its own database on it)."""
    if _private_cluster.process is None or _private_cluster.process.poll() is not None:
        _private_cluster.start()  # left stopped by a test that failed midway
    return _private_cluster


def _store_on(url: str, faulty: _FaultyEngine) -> SqlStore:
    """A SqlStore of `url` whose connections come from `faulty`."""
    engine: Any = faulty  # the part of an Engine the hot path uses
    return SqlStore(url, engine=engine)


def _lost(statement: str) -> DBAPIError:
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    return DBAPIError(statement, None, lost, connection_invalidated=True)


class _AckLost(_FaultyEngine):
    """An engine whose next write lands, then reports the connection lost: what a client
    sees when the server goes down between committing and saying so."""

    armed = True

    def checked_in(self) -> None:
        if self.armed:
            self.armed = False
            raise _lost("COMMIT")


class _LostOnEntry(_FaultyEngine):
    """An engine whose first connection fails at once with a lost connection."""

    calls = 0

    def checking_out(self) -> None:
        self.calls += 1
        if self.calls == 1:
            raise _lost("BEGIN")


def test_a_step_whose_commit_landed_before_the_connection_dropped_counts_as_saved(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    upgrade(pg_database)
    run_id = _stored_run(pg_database, demo_url, tmp_path)
    store = SqlStore(pg_database)
    prepared = prepare(store, run_id, "C0", 1)
    assert not isinstance(prepared, Advance)
    state = run_sync(execute(prepared, PoolCache().for_run(run_id, prepared.loaded.run_config)))

    flaky = _AckLost(get_engine(pg_database))
    advance = commit(_store_on(pg_database, flaky), prepared, state)

    assert not flaky.armed  # the first attempt's commit landed, and "failed"
    # The retry found its own write: saved, the case done, the run complete (so the
    # caller enqueues the aggregation now).
    assert advance == Advance(saved=True, run_finished=True, case_done=True, status="passed")
    assert results.count_turn_rows(pg_database, run_id) == [("C0", 1, 1)]
    run = runs.get_run(pg_database, run_id)
    assert run is not None and (run.finished_cases, run.passed) == (1, 1)
    # A second copy of the same step that is not a retry stays a no-op.
    assert commit(store, prepared, state) == Advance(saved=False)


def test_a_concurrent_duplicate_is_not_mistaken_for_a_landed_retry(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Two copies of a turn ran; the other one saved first. A retry of this one (after a
    lost connection) finds that write there, not its own: not saved, nothing enqueued."""
    upgrade(pg_database)
    run_id = _stored_run(pg_database, demo_url, tmp_path, n=2)
    pool = PoolCache()
    store = SqlStore(pg_database)
    copies = [prepare(store, run_id, "C0", 1) for _ in range(2)]
    steps = []
    for copy in copies:
        assert not isinstance(copy, Advance)
        steps.append((copy, run_sync(execute(copy, pool.for_run(run_id, copy.loaded.run_config)))))
    assert commit(store, *steps[0]).saved

    lost_once = _LostOnEntry(get_engine(pg_database))
    assert commit(_store_on(pg_database, lost_once), *steps[1]) == Advance(saved=False)
    assert lost_once.calls == 2
    assert results.count_turn_rows(pg_database, run_id) == [("C0", 1, 1)]


def test_reconnecting_waits_for_a_server_that_is_still_starting(pg: PostgresServer) -> None:
    """Down, then refusing connections for a while: the hot path's reads keep trying
    (they used to give up at the first refused connection, after one dropped one)."""
    url = pg.create_database("starting")
    upgrade(url)
    assert recovery.pending_case_ids(url, "no-run", 0, 10) == []  # a pooled connection
    pg.stop()
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(recovery.pending_case_ids(url, "no-run", 0, 10))
        except Exception as exc:
            outcome.append(exc)

    # (The server is started from this thread: its death signal follows the thread
    # that started it.)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        # Past the read's first two attempts (at once: the dropped connection; 0.2 s
        # later: refused), before its third (0.7 s, store/sql/db.py RECONNECT_DELAYS).
        time.sleep(0.4)
        assert reader.is_alive()  # still trying
        pg.start()
        reader.join(20)
        assert outcome == [[]]
    finally:
        reader.join(20)
        get_engine(url).dispose()


def test_only_a_lost_connection_counts_as_one(tmp_path: Path) -> None:
    refused = get_engine("postgresql://postgres@127.0.0.1:1/none")
    with pytest.raises(DBAPIError) as down, refused.connect():
        pass
    assert is_connection_lost(down.value)
    with (
        pytest.raises(DBAPIError) as wrong,
        get_engine(f"sqlite:///{tmp_path / 'x.db'}").connect() as connection,
    ):
        connection.execute(text("SELECT * FROM missing"))
    assert not is_connection_lost(wrong.value)


def test_the_turn_statements_replace_a_connection_lost_to_a_restart(
    pg: PostgresServer, tmp_path: Path, demo_url: str
) -> None:
    """The turn's reads and writes run on pooled driver connections (turns.py): one
    the server dropped while it sat in the pool is thrown away and the statement
    retried on a new one, and every connection goes back to the pool ready for
    transactions again."""
    url = pg.create_database("restart")
    upgrade(url)
    try:
        run_id = _stored_run(url, demo_url, tmp_path)
        store = SqlStore(url)
        assert store.load_case(run_id, "C0") is not None  # now pooled
        pg.stop()
        pg.start()
        loaded = store.load_case(run_id, "C0")
        assert loaded is not None and loaded.next_turn == 1
        assert get_engine(url).pool.checkedout() == 0
        with get_engine(url).connect() as connection:
            driver: Any = connection.connection.driver_connection
            assert driver.autocommit is False
            assert connection.execute(text("SELECT count(*) FROM cases")).scalar() == 1
    finally:
        get_engine(url).dispose()


def test_removing_a_run_waits_for_a_step_being_saved_and_keeps_none_of_its_rows(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """A submitter stopped while storing its run removes it while its first conversations
    may be running: a step committed during the removal left its turn row behind."""
    upgrade(pg_database)
    run_id = _stored_run(pg_database, demo_url, tmp_path)
    saving = psycopg.connect(pg_database)  # a step being saved: its case moved, its row in
    saving.execute("UPDATE cases SET next_turn = 2 WHERE run_id = %s AND case_id = 'C0'", (run_id,))
    saving.execute(
        "INSERT INTO turns (run_id, case_id, turn, input, output, tool_calls, awaiting_input,"
        " status, duration_ms) VALUES (%s, 'C0', 1, 'hi', 'hello', '[]', false, 'passed', 5)",
        (run_id,),
    )
    removing = threading.Thread(target=runs.delete_run, args=(pg_database, run_id))
    removing.start()
    # Until the removal is seen waiting on the step's transaction (or is over).
    deadline = time.monotonic() + 10
    with psycopg.connect(pg_database, autocommit=True) as watcher:
        while (
            removing.is_alive()
            and not watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (saving.info.backend_pid,),
            ).fetchone()
        ):
            assert time.monotonic() < deadline, "the removal neither waited nor finished"
            time.sleep(0.01)
    assert removing.is_alive(), "the removal waits for the step being saved"
    saving.commit()
    removing.join(10)
    saving.close()
    assert not removing.is_alive()
    assert runs.get_run(pg_database, run_id) is None
    assert results.count_turn_rows(pg_database, run_id) == []
    # A message of the removed run still queued does nothing, and says why.
    assert prepare(SqlStore(pg_database), run_id, "C0", 1) == Advance(saved=False, gone=True)
