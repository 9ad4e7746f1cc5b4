"""`agenttest-submit prune` on a fleet's Postgres while another run goes on: the old
runs go with every row, the run under way is untouched and finishes. Embedded:
test_prune.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import (
    Fleet,
    WatchingAgent,
    expense_case,
    fleet_on,
    turn_rows,
    wait_until,
    write_cases,
    write_project,
)
from test_prune import rows_of

from agenttest_worker.store.sql import runs

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_prune_on_postgres_beside_a_run_under_way(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    fleet.start("w", concurrency=4)
    # A suite of this test's own: the session's database holds other tests' runs too.
    suite = f"nightly-{tmp_path.name}"
    demo = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    old = [fleet.submit_no_wait([*demo, "--suite", suite]) for _ in range(2)]
    for run_id in old:
        fleet.wait_done(run_id)
    before = {run_id: rows_of(fleet.database_url, run_id) for run_id in old}
    assert all(counts["turns"] for counts in before.values())
    time.sleep(1.2)
    release = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.turn == 2, release)
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(3)])
        going = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config), "--suite", suite]
        )
        wait_until(lambda: len(agent.seen()) >= 6, 30, "the run under way mid-conversation")
        pruned = fleet.submit(["prune", "--older-than", "1s", "--suite", suite])
        assert pruned.returncode == 0, pruned.stderr
        assert pruned.stdout.splitlines()[-1] == (
            f"removed 2 run(s) older than 1s, {sum(sum(c.values()) for c in before.values())} "
            "row(s)"
        )
        assert going not in pruned.stdout
        release.set()
        fleet.wait_done(going)
    for run_id in old:
        assert set(rows_of(fleet.database_url, run_id).values()) == {0}
    run = runs.get_run(fleet.database_url, going)
    assert run is not None and run.passed == 3
    assert len(turn_rows(fleet.database_url, going)) == 9
