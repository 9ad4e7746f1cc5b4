"""Celery beat as the fleet's sweeper: a run whose messages the broker lost finishes.

Workers sweep for stalled runs in a thread by default; with AGENTTEST_WORKER_SWEEPER=false
nothing does, until `celery -A agenttest_worker beat` sends `agenttest.sweep`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on, greeting_case, turn_rows, write_cases, write_project

from agenttest_worker.store.sql import runs

# Every test here runs a Celery worker and `celery beat`.
pytestmark = pytest.mark.fleet

STALL = "2"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _purged(broker_url: str, queue: str) -> int:
    """Empty the broker's `queue`; how many messages it held."""
    from agenttest_worker.fleet.celery_app import app

    with app.connection_for_write(broker_url) as connection:
        return int(connection.default_channel.queue_purge(queue))


def test_beat_sweeps_a_run_whose_messages_were_lost(
    fleet: Fleet, redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    config = write_project(tmp_path, demo_url)
    cases = write_cases(tmp_path, [greeting_case(f"B{i}") for i in range(3)])
    run_id = fleet.submit_no_wait(
        ["-i", str(cases), "-n", "slow.expense", "--config", str(config)], stall_seconds=STALL
    )
    # The broker loses the queued work (a restart without persistence) before any
    # worker took it.
    assert _purged(redis_db, "agenttest") == 1
    fleet.start("w", concurrency=2, worker_sweeper="false", stall_seconds=STALL)
    time.sleep(5)  # past the stall period: no worker thread sweeps
    run = runs.get_run(pg_database, run_id)
    assert run is not None and run.status == "running" and run.finished_cases == 0

    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agenttest_worker",
            "beat",
            "-s",
            str(tmp_path / "beat-schedule"),
            "--loglevel=INFO",
        ],
        env={**fleet.env, "AGENTTEST_STALL_SECONDS": STALL},
        stdout=(tmp_path / "beat.log").open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        fleet.wait_done(run_id, timeout=60)
    finally:
        beat.terminate()
        beat.wait(10)
    assert turn_rows(pg_database, run_id) == {(f"B{i}", 1): 1 for i in range(3)}
    # Nothing else sweeps here (the run stood still above): beat's sweeps did it.
    assert (
        "Sending due task agenttest-sweep (agenttest.sweep)" in (tmp_path / "beat.log").read_text()
    )
