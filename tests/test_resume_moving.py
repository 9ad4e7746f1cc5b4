"""`resume RUN` on a run whose conversations are still moving resumes nothing and says
so: on a fleet, while any conversation moved within AGENTTEST_STALL_SECONDS (the
workers are running it); embedded, while the process running it is alive. Otherwise
every conversation would be played twice at once, calling its agents twice.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_kit import openai_agent, write_config
from fleet import (
    Fleet,
    Seen,
    WatchingAgent,
    expense_case,
    fleet_on,
    turn_rows,
    wait_until,
    write_cases,
    write_project,
)
from sqlalchemy.exc import OperationalError

from agenttest_submit.cli.main import main
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.models import RunRow

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
    # The first turns answer at once; later calls wait until `resume` has answered, so
    # the run is certainly still moving while it looks.
    resumed_yet = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.turn != 1, resumed_yet)
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(c) for c in IDS])
        # A held turn outlasts the fleet tests' 5 s visibility timeout: not given back.
        worker = fleet.start("w", concurrency=4, wait=False, visibility_timeout="300")
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        worker.wait_ready()
        agent.wait_for(lambda s: s.turn != 1, timeout=60)  # the conversations are under way
        try:
            resumed = fleet.submit(["resume", run_id], stall_seconds="30")
        finally:
            resumed_yet.set()
        assert resumed.returncode == 0, resumed.stderr
        assert f"run {run_id} is still moving" in resumed.stderr, resumed.stderr
        assert "nothing resumed" in resumed.stderr
        # When it will accept: the stall period after the last move, at the latest.
        when = re.search(
            r"It accepts once nothing has moved for that long: at "
            r"\d\d:\d\d:\d\d UTC \(in (\d+) s\)",
            resumed.stderr,
        )
        assert when is not None and int(when.group(1)) <= 30, resumed.stderr
        assert "within 15 s on Redis (AGENTTEST_WORKER_GONE_SECONDS)" in resumed.stderr
        fleet.wait_done(run_id, timeout=60)
        calls = Counter((s.case, s.turn) for s in agent.seen())
    assert calls == ONCE_EACH, calls
    assert turn_rows(fleet.database_url, run_id) == {(c, t): 1 for c in IDS for t in (1, 2, 3)}


def test_resume_refuses_a_run_its_embedded_submitter_is_still_running(
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The first turns answer at once; later calls wait a second each until `resume` has
    # answered, so the run is still moving while it looks, then go on at once.
    resumed_yet = threading.Event()

    def until_resumed(seen: Seen) -> float:
        return 0.0 if seen.turn == 1 or resumed_yet.is_set() else 1.0

    with WatchingAgent(demo_url, delay=until_resumed) as agent:
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
            agent.wait_for(lambda s: s.turn == 2)  # under way
            url = f"sqlite:///{(tmp_path / '.agenttest' / 'agenttest.db').resolve()}"
            first_turns = {(c, 1) for c in IDS}

            def stored() -> RunRow | None:
                try:
                    found = runs.latest_run(url)
                    if found is not None and first_turns <= set(turn_rows(url, found.id)):
                        return found
                except OperationalError:  # the database is still being created
                    pass
                return None

            run = wait_until(stored, 30, "the run and its first turns to be stored", step=0.02)
            # `resume` runs in this process: what it proves is about the other one.
            monkeypatch.chdir(tmp_path)
            capsys.readouterr()
            resumed_code = main(["resume", run.id])
            resumed_err = capsys.readouterr().err
            resumed_yet.set()
            _, err = running.communicate(timeout=60)
        finally:
            if running.poll() is None:
                running.kill()
        calls = Counter((s.case, s.turn) for s in agent.seen())
    assert running.returncode == 0, err
    assert resumed_code == 0, resumed_err
    assert f"run {run.id} is still moving" in resumed_err, resumed_err
    assert f"process {running.pid}" in resumed_err and "nothing resumed" in resumed_err
    assert calls == ONCE_EACH, calls
