"""A worker killed mid-turn on a Redis broker: its conversations come back in seconds,
not after the visibility timeout (an hour) nor the stall period (ten minutes): its
presence mark expires, another worker's sweeper gives its messages back
(fleet/worker_presence.py), and nothing is played or recorded twice. On RabbitMQ the
broker gives them back itself when the dead worker's connection closes
(test_distributed.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import (
    Fleet,
    WatchingAgent,
    case_rows,
    expense_case,
    fleet_on,
    turn_rows,
    wait_until,
    write_cases,
    write_project,
)


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_a_killed_workers_turns_come_back_in_seconds(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    # Long enough that neither the broker nor the stall sweeper brings them back here.
    fleet.env.update(
        AGENTTEST_VISIBILITY_TIMEOUT="3600",
        AGENTTEST_STALL_SECONDS="600",
        AGENTTEST_WORKER_GONE_SECONDS="3",
    )
    never = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.worker == "doomed", never)  # mid-turn when it dies
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(3)])
        doomed = fleet.start("doomed", concurrency=8)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        wait_until(
            lambda: {s.case for s in agent.seen() if s.worker == "doomed"} >= {"C0", "C1", "C2"},
            30,
            "every conversation's first turn in flight on the doomed worker",
        )
        fleet.start("survivor", concurrency=8)
        time.sleep(1.5)  # the doomed worker's held messages are marked by now
        doomed.kill()
        killed_at = time.monotonic()
        fleet.wait_done(run_id, timeout=30)
        took = time.monotonic() - killed_at
        never.set()
    assert took < 30
    # Every turn recorded once, played to the end by the survivor.
    assert set(turn_rows(fleet.database_url, run_id).values()) == {1}
    assert sorted(turn_rows(fleet.database_url, run_id)) == [
        (f"C{i}", t) for i in range(3) for t in (1, 2, 3)
    ]
    assert [status for _, _, status in case_rows(fleet.database_url, run_id)] == ["passed"] * 3
    survivor_turns = {(s.case, s.turn) for s in agent.seen() if s.worker == "survivor"}
    assert {(f"C{i}", 1) for i in range(3)} <= survivor_turns
    assert "is gone (no presence mark for 3.0s): gave its" in fleet.logs()
