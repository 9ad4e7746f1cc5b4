"""A store that refuses writes for a while: a statement timeout, a full disk.

A step whose save the database refused for now used to fail: its turn was played
again (its agents called again) and the calls of the first play counted nowhere. The
save is now tried again for AGENTTEST_STORE_RETRY_SECONDS, as a lost connection is
(db.reconnecting), embedded and on a fleet: each turn calls its agent exactly once and
every call is counted. A waiting submitter says why the run does not move.
(A lost connection itself: test_store_reconnect.py.)
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fault_kit import write_config
from fleet import fleet_on, run_id_of, write_cases
from scripted_agent import Reply, ScriptedAgent
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from agenttest_submit.run.embedded import drive
from agenttest_submit.run.progress import Progress
from agenttest_submit.run.runner import store_run
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.cases.case_model import Case
from agenttest_worker.driver.event_loops import run_sync
from agenttest_worker.driver.step import Advance, PoolCache, commit_or_fail, execute, prepare
from agenttest_worker.engine import RunOptions
from agenttest_worker.settings import get_settings
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.memory.buffered import BufferedStore
from agenttest_worker.store.memory.flush_batch import FlushBatch, StepRefused
from agenttest_worker.store.memory.flush_writes import write_flush
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import get_engine, on_refusal, upgrade
from agenttest_worker.store.sql.models import AgentCallRow
from agenttest_worker.store.sql.usage import calls_unsaved, stored_usage


@contextmanager
def _agent(delay: float = 0.0) -> Iterator[ScriptedAgent]:
    """A scripted target that answers every turn "noted" (after `delay` seconds)."""
    with ScriptedAgent() as agent:
        agent.script("target", lambda _body: Reply(content="noted", delay=delay))
        yield agent


def _stored_run(url: str, agent: ScriptedAgent, directory: Path, cases: int = 1) -> str:
    entry = {"protocol": "openai", "base_url": agent.base_url, "model": "target"}
    config = load_config(str(write_config(directory, {"scripted": entry})))
    turns = [{"input": t, "assertions": [{"type": "contains", "value": "noted"}]} for t in "ab"]
    run_id, total = store_run(
        url,
        [
            Case.model_validate({"id": f"C{i}", "type": "multi_turn", "turns": turns})
            for i in range(cases)
        ],
        options=RunOptions(target="scripted", interactive=False),
        config=config,
        target="scripted",
        label="refusals",
    )
    runs.start_run(url, run_id, total)
    return run_id


def _agent_calls(url: str, run_id: str) -> int:
    with get_engine(url).connect() as connection:
        found = connection.execute(
            select(func.count()).select_from(AgentCallRow).where(AgentCallRow.run_id == run_id)
        ).scalar()
    return int(found or 0)


class _FaultyEngine:
    """The store's engine with a fault in its connections (as in test_store_reconnect.py):
    passed to a real SqlStore, below the hot path's own retry."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self.checkouts = 0

    def raw_connection(self) -> Any:
        self.checkouts += 1
        pooled = self.engine.raw_connection()
        try:
            self.checked_out(pooled.driver_connection)
        except BaseException:
            pooled.close()
            raise
        return _Pooled(pooled, self)

    def checked_out(self, driver: Any) -> None:
        pass

    def checking_in(self, driver: Any) -> None:
        pass


class _Pooled:
    def __init__(self, pooled: Any, engine: _FaultyEngine) -> None:
        self.pooled, self.engine = pooled, engine
        self.driver_connection = pooled.driver_connection

    @property
    def is_valid(self) -> bool:
        return bool(self.pooled.is_valid)

    def invalidate(self, exc: BaseException | None = None) -> None:
        self.pooled.invalidate(exc)

    def close(self) -> None:
        if self.pooled.is_valid:
            self.engine.checking_in(self.driver_connection)
        self.pooled.close()


class _TimeoutOnce(_FaultyEngine):
    """The first connection checked out runs with a statement timeout of 200 ms."""

    def checked_out(self, driver: Any) -> None:
        if self.checkouts == 1:
            driver.execute("SET statement_timeout = 200")
            driver.commit()

    def checking_in(self, driver: Any) -> None:
        driver.execute("RESET statement_timeout")
        driver.commit()


class _DiskFull(_FaultyEngine):
    """Every connection checked out fails with Postgres's disk-full error, `failures`
    times (None: for ever)."""

    def __init__(self, engine: Any, failures: int | None) -> None:
        super().__init__(engine)
        self.failures = failures

    def checked_out(self, driver: Any) -> None:
        if self.failures is None or self.checkouts <= self.failures:
            raise psycopg.errors.DiskFull(
                'could not extend file "base/16384/16385": No space left on device'
            )


def _played(url: str, run_id: str, agent: ScriptedAgent) -> Any:
    """Turn 1 of C0, prepared and played (one call to the agent), not yet saved."""
    prepared = prepare(SqlStore(url), run_id, "C0", 1)
    assert not isinstance(prepared, Advance)
    pool = PoolCache().for_run(run_id, prepared.loaded.run_config)
    state = run_sync(execute(prepared, pool))
    assert len(agent.requests("target")) == 1
    return prepared, state


@contextmanager
def _row_locked(url: str, run_id: str, seconds: float) -> Iterator[None]:
    """The run's conversations locked (as a long transaction would) for `seconds`."""
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain) as locker:
        locker.execute("SELECT 1 FROM cases WHERE run_id = %s FOR UPDATE", (run_id,))
        release = threading.Timer(seconds, locker.commit)
        release.start()
        try:
            yield
        finally:
            release.join()


def test_a_save_cancelled_by_a_statement_timeout_is_saved_by_its_retry_without_calling_again(
    pg_database: str, tmp_path: Path
) -> None:
    upgrade(pg_database)
    heard: list[str] = []
    on_refusal(heard.append)
    with _agent() as agent:
        run_id = _stored_run(pg_database, agent, tmp_path)
        prepared, state = _played(pg_database, run_id, agent)
        faulty = _TimeoutOnce(get_engine(pg_database))
        engine: Any = faulty
        with _row_locked(pg_database, run_id, 1.0):
            advance = commit_or_fail(SqlStore(pg_database, engine=engine), prepared, state)
        assert len(agent.requests("target")) == 1, "the agent was not called again"
    assert advance.saved and advance.next_turn == 2
    assert faulty.checkouts >= 2
    assert any(reason.startswith("statement timeout (") for reason in heard), heard
    assert _agent_calls(pg_database, run_id) == 1


def test_a_save_refused_for_a_full_disk_is_saved_once_the_disk_has_room(
    pg_database: str, tmp_path: Path
) -> None:
    upgrade(pg_database)
    heard: list[str] = []
    on_refusal(heard.append)
    with _agent() as agent:
        run_id = _stored_run(pg_database, agent, tmp_path)
        prepared, state = _played(pg_database, run_id, agent)
        engine: Any = _DiskFull(get_engine(pg_database), failures=3)
        advance = commit_or_fail(SqlStore(pg_database, engine=engine), prepared, state)
        assert len(agent.requests("target")) == 1
    assert advance.saved and advance.next_turn == 2
    assert any(reason.startswith("disk full (") for reason in heard), heard
    assert _agent_calls(pg_database, run_id) == 1


def test_calls_of_a_step_the_store_kept_refusing_are_counted_in_the_runs_usage(
    pg_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past AGENTTEST_STORE_RETRY_SECONDS the step gives up (the turn will be played
    again), but the call it made is in the run's usage and totals."""
    monkeypatch.setenv("AGENTTEST_STORE_RETRY_SECONDS", "1")
    get_settings.cache_clear()
    upgrade(pg_database)
    with _agent() as agent:
        run_id = _stored_run(pg_database, agent, tmp_path)
        prepared, state = _played(pg_database, run_id, agent)
        engine: Any = _DiskFull(get_engine(pg_database), failures=None)
        started = time.monotonic()
        with pytest.raises(DBAPIError, match="No space left on device"):
            commit_or_fail(SqlStore(pg_database, engine=engine), prepared, state)
        assert 1 <= time.monotonic() - started < 5
    run = runs.get_run(pg_database, run_id)
    assert run is not None
    usage = stored_usage(run.usage)
    assert usage["target"].calls == 1 and usage["target"].total_tokens == 15
    assert calls_unsaved(run.usage) == 1, "counted as a call whose turn is not recorded"
    assert run.total_tokens == 15
    assert _agent_calls(pg_database, run_id) == 0, "the step itself was not stored"


def _sqlite_disk_full(directory: Path) -> sqlite3.OperationalError:
    """SQLite's own error for a full disk (SQLITE_FULL), from a database capped small."""
    database = sqlite3.connect(directory / "full.db")
    try:
        database.execute("PRAGMA max_page_count = 4")
        database.execute("CREATE TABLE t (x TEXT)")
        for _ in range(64):
            database.execute("INSERT INTO t VALUES (?)", ("x" * 4096,))
        database.commit()
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        database.close()
    raise AssertionError("the capped database never filled up")


class _FullForAWhile:
    """Writes an embedded store's flushes, failing them with a full disk until
    `seconds` after the first."""

    def __init__(self, error: sqlite3.OperationalError, seconds: float) -> None:
        self.error, self.seconds = error, seconds
        self.until: float | None = None
        self.refused = 0

    def __call__(self, url: str, batch: FlushBatch) -> list[StepRefused]:
        if self.until is None:
            self.until = time.monotonic() + self.seconds
        if time.monotonic() < self.until:
            self.refused += 1
            raise DBAPIError.instance("INSERT INTO turns ...", None, self.error, sqlite3.Error)
        return write_flush(url, batch)


def test_an_embedded_run_keeps_its_turns_while_the_disk_is_full_and_calls_each_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = get_settings().effective_database_url()
    upgrade(url)
    writes = _FullForAWhile(_sqlite_disk_full(tmp_path), seconds=1.5)
    # Slow enough that the run's flushes fall due, and are refused, while it goes on.
    with _agent(delay=0.3) as agent:
        run_id = _stored_run(url, agent, tmp_path, cases=4)
        store = BufferedStore.from_database(url, run_id, writes=writes)
        conversations = [(f"C{i}", 1) for i in range(4)]
        asyncio.run(drive(url, run_id, conversations, 2, Progress(4), store=store, ask=False))
        calls = len(agent.requests("target"))
    err = capsys.readouterr().err
    assert writes.refused >= 1
    assert calls == 8, "each of the 4 conversations' 2 turns called its agent once"
    assert "the store refuses writes: disk full (" in err, err
    assert "the store takes writes again" in err, err
    run = runs.get_run(url, run_id)
    assert run is not None and (run.finished_cases, run.passed) == (4, 4)
    assert _agent_calls(url, run_id) == 8


@pytest.mark.fleet
def test_a_fleet_rides_out_statement_timeouts_and_its_submitter_says_why_it_waits(
    redis_db: str, empty_pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Every statement of the fleet's database is cancelled past 300 ms, and the run's
    conversations are locked by a long transaction while their first turns are saved:
    each save is cancelled and retried until the lock goes. Each turn calls its agent
    once, and the waiting submitter says that the store refuses writes."""
    url = empty_pg_database
    upgrade(url)
    name = url.rsplit("/", 1)[1]
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET statement_timeout = 300')
    release = threading.Event()
    cases = write_cases(tmp_path, [{"id": f"S{i}", "input": "hello"} for i in range(2)])
    with ScriptedAgent() as agent:
        agent.script("target", [Reply(content="noted", hold=release)] * 2)
        entry = {
            "protocol": "openai",
            "base_url": agent.base_url,
            "model": "target",
            "timeout": 60,
        }
        config = write_config(tmp_path, {"scripted": entry})
        with contextmanager(fleet_on)(redis_db, url, demo_url, tmp_path, schema=False) as fleet:
            fleet.start("w", concurrency=2)
            submitter = fleet.submit_background(
                ["-i", str(cases), "-n", "scripted", "--config", str(config)]
            )

            def both_waiting() -> bool:
                return len(agent.requests("target")) == 2

            _wait(both_waiting, 60)
            with psycopg.connect(plain) as locker:
                locker.execute("SELECT 1 FROM cases FOR UPDATE")
                release.set()
                time.sleep(6)  # the saves are cancelled, again and again
                locker.commit()
            _, err = submitter.communicate(timeout=60)
            logs = fleet.logs()
        calls = len(agent.requests("target"))
    assert submitter.returncode == 0, err + logs[-4000:]
    assert calls == 2, "no turn was played again"
    assert "the store refuses writes: statement timeout (" in err, err
    run_id = run_id_of(err)
    run = runs.get_run(url, run_id)
    assert run is not None and (run.status, run.passed) == ("done", 2)
    assert _agent_calls(url, run_id) == 2
    assert "the store refuses writes for now: statement timeout" in logs


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
