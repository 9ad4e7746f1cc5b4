"""A fleet-wide rate limit with real worker processes: two workers share one agent
limited to N requests per second (`rate_limit: {requests_per_second: N}`); the agent,
which notes when each request arrives, never sees more than N in any second, and the
run completes. (The limiter itself, in process and through Redis: test_rate_limits.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_kit import FaultAgent, max_in_window, openai_agent, write_config
from fleet import (
    Fleet,
    expense_case,
    fleet_on,
    greeting_case,
    run_id_of,
    turn_rows,
    write_cases,
)

# Every test here runs Celery workers (tests/fleet.py).
pytestmark = pytest.mark.fleet

PER_SECOND = 5


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_two_workers_never_exceed_the_agents_requests_per_second(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    with FaultAgent(demo_url) as agent:
        config = write_config(
            tmp_path,
            {
                "limited": openai_agent(
                    agent.base_url, rate_limit={"requests_per_second": PER_SECOND}
                )
            },
        )
        # 24 one-turn conversations and 2 three-turn ones (turn 2 calls the agent twice):
        # 32 requests, more than six seconds' worth at the limit.
        cases = [greeting_case(f"G{i}") for i in range(24)]
        cases += [expense_case("E1"), expense_case("E2")]
        # A turn waits for its slot for up to ~6 s here: above the fleet's 5 s visibility
        # timeout, Redis would hand the message to another worker meanwhile.
        workers = [
            fleet.start(name, concurrency=8, wait=False, visibility_timeout="60")
            for name in ("a", "b")
        ]
        for worker in workers:
            worker.wait_ready()
        done = fleet.submit(
            ["-i", str(write_cases(tmp_path, cases)), "-n", "limited", "--config", str(config)]
        )

    assert done.returncode == 0, done.stderr
    assert "Passed:  26" in done.stdout, done.stdout
    run_id = run_id_of(done.stderr)
    expected = {(f"G{i}", 1): 1 for i in range(24)}
    expected |= {(case, turn): 1 for case in ("E1", "E2") for turn in (1, 2, 3)}
    assert turn_rows(fleet.database_url, run_id) == expected

    arrivals = [r.at for r in agent.seen()]
    assert len(arrivals) == 32, sorted((r.case or "", r.turn) for r in agent.seen())
    # Both workers called the agent: the limit held across processes, not within one.
    assert {r.worker for r in agent.seen()} == {"a", "b"}
    busiest = max_in_window(arrivals, 1.0)
    assert busiest <= PER_SECOND, sorted(t - min(arrivals) for t in arrivals)
    # ... and it was what held the fleet back: it ran at the limit, not below it.
    assert busiest == PER_SECOND
    assert max(arrivals) - min(arrivals) >= (len(arrivals) - PER_SECOND) / PER_SECOND - 0.1
