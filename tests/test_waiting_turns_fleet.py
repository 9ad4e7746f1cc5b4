"""A turn waiting for an agent (a rate-limit slot, a long 429 back-off) does not look
lost: it marks itself alive while it waits, so neither the broker's visibility timeout
nor the stall sweeper hands it to another thread, and the agent is called once per turn.
(The same turns without the marks: redelivered after AGENTTEST_VISIBILITY_TIMEOUT and
re-enqueued after AGENTTEST_STALL_SECONDS, each copy calling the agent again.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_kit import Fault, FaultAgent, openai_agent, write_config
from fleet import Fleet, fleet_on, greeting_case, run_id_of, turn_rows, write_cases

# Every test here runs Celery workers (tests/fleet.py).
pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_turns_waiting_out_a_429_are_neither_redelivered_nor_re_enqueued(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """The agent answers the first second's calls 429 with Retry-After 6 s: under
    `shared` (`rate_limit: {}`) every turn waits for the fleet-wide pause in the limiter;
    under `solo` (no rate_limit) a refused call waits out its own back-off, and the
    worker's other calls to it wait in the limiter for the pause its 429 set (a limit
    learned from the agent). The waits are three times the visibility timeout and the
    stall period; every turn still calls the agent once more (after the pause) and only
    once."""
    retry_after = 6.0
    with FaultAgent(demo_url) as agent:
        entries = {
            name: openai_agent(
                agent.base_url, max_retries=3, base_delay="100ms", headers={"X-Entry": name}
            )
            for name in ("solo", "shared")
        }
        entries["shared"]["rate_limit"] = {}
        config = write_config(tmp_path, entries)
        cases = [
            {**greeting_case(f"{name}-{i}"), "agent": name}
            for i in range(2)
            for name in ("solo", "shared")
        ]
        settings = {"visibility_timeout": "2", "stall_seconds": "2"}
        workers = [fleet.start(n, concurrency=4, wait=False, **settings) for n in ("a", "b")]
        for worker in workers:
            worker.wait_ready()
        too_many = Fault(
            status=429,
            headers={"Retry-After": f"{retry_after:g}"},
            body={"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
        )
        # The calls of the first second are refused; every later one is answered.
        agent.rule = lambda seen: too_many if seen.at < agent.seen()[0].at + 1.0 else None
        done = fleet.submit(
            ["-i", str(write_cases(tmp_path, cases)), "-n", "solo", "--config", str(config)],
            timeout=60,
            **settings,
        )
        logs = fleet.logs()

    assert done.returncode == 0, done.stderr + logs[-4000:]
    run_id = run_id_of(done.stderr)
    first = agent.seen()[0].at
    calls = [(r.case, round(r.at - first, 2), r.status) for r in agent.seen()]
    ids = [c["id"] for c in cases]
    # Each turn waited (out its own back-off, or for the shared pause) for three
    # visibility timeouts, and called the agent once after that.
    assert Counter(r.case for r in agent.seen() if r.status == 200) == dict.fromkeys(ids, 1), calls
    assert all(r.at - first >= retry_after - 0.1 for r in agent.seen() if r.status == 200), calls
    assert {r.case for r in agent.seen() if r.status == 429} & {"solo-0", "solo-1"}, calls
    # Not this run's turns (the sweeper may take stalled runs another test left in the
    # same database, which is its job).
    swept = [line for line in (logs + done.stderr).splitlines() if "re-enqueued" in line]
    assert not [line for line in swept if run_id in line], swept
    assert turn_rows(fleet.database_url, run_id) == {(c, 1): 1 for c in ids}
