"""`resume RUN` on a run whose conversations are still moving resumes nothing and says
so: on a fleet, while any conversation moved within AGENTTEST_STALL_SECONDS (the
workers are running it); embedded, while the process running it is alive. Otherwise
every conversation would be played twice at once, calling its agents twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_kit import openai_agent, write_config
from fleet import (
    Fleet,
    WatchingAgent,
    expense_case,
    fleet_on,
    turn_rows,
    write_cases,
    write_project,
)

from agenttest_worker.store import runs

IDS = ["M1", "M2"]
# Turn 2 of an expense case calls the agent twice (again with the tool's result).
ONCE_EACH = {(c, t): 2 if t == 2 else 1 for c in IDS for t in (1, 2, 3)}


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_resume_refuses_a_run_the_fleet_is_still_moving(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    with WatchingAgent(demo_url, delay=1.0) as agent:
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(c) for c in IDS])
        worker = fleet.start("w", concurrency=4, wait=False)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        worker.wait_ready()
        agent.wait_for(lambda s: True)  # the conversations are under way
        resumed = fleet.submit(["resume", run_id], stall_seconds="30")
        assert resumed.returncode == 0, resumed.stderr
        assert f"run {run_id} is still moving" in resumed.stderr, resumed.stderr
        assert "nothing resumed" in resumed.stderr
        fleet.wait_done(run_id, timeout=60)
        calls = Counter((s.case, s.turn) for s in agent.seen())
    assert calls == ONCE_EACH, calls
    assert turn_rows(fleet.database_url, run_id) == {(c, t): 1 for c in IDS for t in (1, 2, 3)}


def test_resume_refuses_a_run_its_embedded_submitter_is_still_running(
    demo_url: str, tmp_path: Path
) -> None:
    with WatchingAgent(demo_url, delay=1.0) as agent:
        config = write_config(tmp_path, {"demo": openai_agent(agent.base_url)})
        cases = write_cases(tmp_path, [expense_case(c) for c in IDS])
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "agenttest_submit.cli"]
        running = subprocess.Popen(
            [*command, "-i", str(cases), "-n", "demo", "--config", str(config)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            agent.wait_for(lambda s: s.turn == 2)  # under way, and stored
            url = f"sqlite:///{(tmp_path / '.agenttest' / 'agenttest.db').resolve()}"
            run = runs.latest_run(url)
            assert run is not None
            resumed = subprocess.run(
                [*command, "resume", run.id],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
            )
            _, err = running.communicate(timeout=60)
        finally:
            if running.poll() is None:
                running.kill()
        calls = Counter((s.case, s.turn) for s in agent.seen())
    assert running.returncode == 0, err
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run.id} is still moving" in resumed.stderr, resumed.stderr
    assert f"process {running.pid}" in resumed.stderr and "nothing resumed" in resumed.stderr
    assert calls == ONCE_EACH, calls

