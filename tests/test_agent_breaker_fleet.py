"""The breaker is the fleet's: calls that one worker could not connect open it for all.

Worker `a` (queue qa) plays a run against a dead agent until the breaker opens; worker
`b` (queue qb) has never called that agent, yet every case of the next run fails at once
with "agent dead unreachable since ...": it read the breaker from Redis. (In process, b
would have spent its own retries on three calls first; the rules: test_agent_breaker.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_servers import refused_url
from fault_kit import openai_agent, write_config
from fleet import Fleet, fleet_on, run_id_of, write_cases

from agenttest_worker.store.sql import run_results as results

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _errors(fleet: Fleet, args: list[str], queue: str) -> list[str]:
    done = fleet.submit(args, queue=queue)
    assert done.returncode == 1, done.stderr
    report = results.get_report(fleet.database_url, run_id_of(done.stderr), "jsonl")
    assert report is not None
    return [json.loads(line)["turns"][0]["error"] for line in report.splitlines() if line]


def test_a_dead_agent_fails_fast_on_every_worker(fleet: Fleet, tmp_path: Path) -> None:
    dead = openai_agent(refused_url() + "/v1", base_delay=0.2)
    config = write_config(tmp_path, {"dead": dead})
    workers = [fleet.start(name, concurrency=2, wait=False, queue=f"q{name}") for name in "ab"]
    for worker in workers:
        worker.wait_ready()

    def run(name: str, count: int) -> list[str]:
        cases = write_cases(tmp_path, [{"id": f"{name}{i}", "input": "hi"} for i in range(count)])
        args = ["-i", str(cases), "-n", "dead", "--config", str(config)]
        return _errors(fleet, args, queue=f"q{name}")

    first = run("a", 3)  # the default AGENTTEST_BREAKER_FAILURES: 3 calls in a row
    assert all(e.startswith("agent error: cannot reach dead (cannot connect to") for e in first)
    assert all("ssl:" not in e for e in first), first

    second = run("b", 6)
    assert all("agent error: agent dead unreachable since " in e for e in second), second
