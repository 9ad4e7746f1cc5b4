"""The workers' default pool (agenttest_worker/fleet/loop_pool.py): turns in flight are
coroutines on one event loop, not threads, and a turn's message is acknowledged only
when its coroutine has ended.

On a real fleet (Redis, Postgres, `celery -A agenttest_worker worker`) in front of the
demo agents, slowed down by a WatchingAgent."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from fleet import (
    Fleet,
    WatchingAgent,
    case_rows,
    expense_case,
    fleet_on,
    greeting_case,
    turn_rows,
    wait_until,
    write_cases,
    write_project,
)

from agenttest_worker.fleet.loop_pool import DEFERRED, raise_open_files_limit


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@contextmanager
def fleet_without_schema(
    redis_url: str, database_url: str, demo_url: str, workdir: Path
) -> Iterator[Fleet]:
    """A fleet whose workers find the database without its schema (closed on leaving,
    a failed assertion included)."""
    yield from fleet_on(redis_url, database_url, demo_url, workdir, schema=False)


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^Threads:\s+(\d+)", status, re.M)
    assert found is not None
    return int(found.group(1))


@pytest.mark.fleet
def test_one_worker_keeps_every_turn_it_may_take_in_flight_on_a_few_threads(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    count = 300
    with WatchingAgent(demo_url, delay=4.0) as agent:
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [greeting_case(f"G{i}") for i in range(count)])
        worker = fleet.start("loop", concurrency=count)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        # Every turn reaches the agent while the first ones still wait for their reply:
        # all of them are in flight at once, in one process...
        wait_until(lambda: len(agent.seen()) >= count, 30, f"{count} requests in flight")
        first, last = agent.seen()[0].at, agent.seen()[count - 1].at
        assert last - first < 4.0
        # ...which runs them on a handful of threads, not one each.
        assert _threads(worker.pid) < 40
        fleet.wait_done(run_id, timeout=60)

    assert turn_rows(fleet.database_url, run_id) == {(f"G{i}", 1): 1 for i in range(count)}
    assert {status for _, _, status in case_rows(fleet.database_url, run_id)} == {"passed"}
    assert len(agent.seen()) == count
    log = worker.log()
    # The worker log says what each turn did once it had ended, not that it was deferred.
    assert DEFERRED not in log
    assert (
        len(re.findall(r"agenttest\.turn\[[^\]]+\] succeeded in [\d.e-]+s: .* case passed", log))
        == count
    )


@pytest.mark.fleet
def test_a_warm_shutdown_lets_the_turns_in_flight_finish(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """SIGTERM while ten turns wait on the agent: the worker waits for them, each saves
    its step, and a worker started after it finds nothing left to play."""
    with WatchingAgent(demo_url, delay=2.0) as agent:
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [greeting_case(f"W{i}") for i in range(10)])
        first = fleet.start("first", concurrency=10)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        wait_until(lambda: len(agent.seen()) >= 10, 30, "ten turns in flight")
        first.stop(timeout=30)
        assert not first.alive()
        assert turn_rows(fleet.database_url, run_id) == {(f"W{i}", 1): 1 for i in range(10)}
        fleet.start("second", concurrency=10)
        fleet.wait_done(run_id, timeout=60)

    assert {status for _, _, status in case_rows(fleet.database_url, run_id)} == {"passed"}
    assert [s.worker for s in agent.seen()] == ["first"] * 10


@pytest.mark.fleet
def test_a_worker_asked_for_celery_time_limits_refuses_to_start_and_says_what_to_use(
    fleet: Fleet,
) -> None:
    """A coroutine cannot be stopped by Celery's time limits (a signal to a child
    process): the worker names each one it was given and leaves with EX_USAGE."""
    worker = fleet.start(
        "limited", wait=False, args=("--time-limit", "30", "--soft-time-limit", "20")
    )
    assert worker.process.wait(60) == 64
    log = worker.log()
    assert "cannot honour Celery's time limits" in log
    assert "task_time_limit / --time-limit (30 s)" in log
    assert "task_soft_time_limit / --soft-time-limit (20 s)" in log
    assert "--turn-timeout and --timeout, and a run's --deadline" in log
    assert " ready." not in log
    assert "Traceback" not in log


def test_a_task_declaring_a_time_limit_is_refused_too(caplog: pytest.LogCaptureFixture) -> None:
    from celery import Celery

    from agenttest_worker.fleet.celery_app import app
    from agenttest_worker.fleet.loop_pool import TaskPool, refuse_time_limits

    refuse_time_limits(TaskPool(1, app=app))  # the fleet's own tasks declare none
    limited = Celery("limited", broker="memory://")

    @limited.task(name="limited.slow", soft_time_limit=5)
    def slow() -> None: ...

    with pytest.raises(SystemExit) as leaving:
        refuse_time_limits(TaskPool(1, app=limited))
    assert leaving.value.code == 64
    assert "task limited.slow's soft_time_limit (5 s)" in caplog.text


def test_the_open_files_limit_is_raised_toward_the_turns_in_flight() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        wanted = min(4096, hard)
        assert raise_open_files_limit(wanted) == wanted
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted
        # Never lowered, never past the hard limit.
        assert raise_open_files_limit(10) == wanted
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.fleet
@pytest.mark.parametrize("pool_args", [(), ("--pool", "threads")], ids=["loop", "threads"])
def test_a_worker_brings_the_schema_current_and_connects_its_publisher_before_its_first_task(
    redis_db: str, empty_pg_database: str, demo_url: str, tmp_path: Path, pool_args: tuple[str, ...]
) -> None:
    # Where tasks run in the worker's own process, Celery sends no `worker_process_init`:
    # the worker connects and migrates as it becomes ready, so that its first run does
    # not wait for it (fleet/tasks.py `_warm_up`).
    import psycopg

    from agenttest_worker.store.sql.db import HEAD_REVISION

    with fleet_without_schema(redis_db, empty_pg_database, demo_url, tmp_path) as fleet:
        fleet.start("fresh", args=pool_args)  # returns once it logs "ready."
        plain = empty_pg_database.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(plain) as conn:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        assert row == (HEAD_REVISION,)
        # And the connection its turns are published on is open: besides the consumer's,
        # more of the worker's connections than the consumer alone makes (fleet/tasks.py).
        db = int(redis_db.rsplit("/", 1)[1])
        clients = redis.Redis.from_url(redis_db).client_list()
        assert len([c for c in clients if int(c["db"]) == db]) >= 2, clients


@pytest.mark.fleet
def test_a_worker_whose_database_is_away_at_start_still_becomes_ready(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    # Its first task connects again (and fails or succeeds on its own): the start-up's
    # connection is only a head start.
    away = pg_database.rsplit("/", 1)[0] + "/agenttest_no_such_database"
    with fleet_without_schema(redis_db, away, demo_url, tmp_path) as fleet:
        worker = fleet.start("early")  # returns once it logs "ready."
        assert "could not connect at start-up; the first task will" in worker.log()
        assert "agenttest_no_such_database" in worker.log()


def _loaded_uvloop(pid: int) -> bool:
    """Whether uvloop's compiled loop is mapped into process `pid`."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return any("/uvloop/loop." in line for line in maps.splitlines())


@pytest.mark.fleet
@pytest.mark.parametrize(("choice", "on_uvloop"), [("auto", True), ("asyncio", False)])
def test_turns_play_on_the_event_loop_agenttest_event_loop_names(
    fleet: Fleet, tmp_path: Path, demo_url: str, choice: str, on_uvloop: bool
) -> None:
    config = write_project(tmp_path, demo_url)
    cases = write_cases(tmp_path, [expense_case(f"E{i}") for i in range(4)])
    worker = fleet.start("loop", event_loop=choice)
    run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "slow.expense", "--config", str(config)])
    fleet.wait_done(run_id, timeout=60)

    assert turn_rows(fleet.database_url, run_id) == {
        (f"E{i}", turn): 1 for i in range(4) for turn in (1, 2, 3)
    }
    assert {status for _, _, status in case_rows(fleet.database_url, run_id)} == {"passed"}
    assert _loaded_uvloop(worker.pid) is on_uvloop


_WITHOUT_UVLOOP = """
import sys
sys.modules["uvloop"] = None  # as on a platform uvloop is not built for
from agenttest_worker.driver.event_loops import new_event_loop
from agenttest_worker.errors import ConfigError
print(type(new_event_loop("auto")).__module__)
try:
    new_event_loop("uvloop")
except ConfigError as exc:
    print(exc)
"""


def test_without_uvloop_auto_falls_back_to_asyncio_and_asking_for_it_is_an_error() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_UVLOOP], capture_output=True, text=True, check=True
    )
    fallback, refusal = done.stdout.splitlines()
    assert fallback.startswith("asyncio.")
    assert refusal.startswith("AGENTTEST_EVENT_LOOP=uvloop, but uvloop is not installed")


def test_new_event_loop_makes_the_kind_asked_for() -> None:
    import asyncio

    import uvloop

    from agenttest_worker.driver.event_loops import new_event_loop

    for choice, kind in (("auto", uvloop.Loop), ("uvloop", uvloop.Loop)):
        loop = new_event_loop(choice)  # type: ignore[arg-type]
        try:
            assert isinstance(loop, kind)
        finally:
            loop.close()
    loop = new_event_loop("asyncio")
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()
