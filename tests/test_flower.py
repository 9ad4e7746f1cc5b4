"""Flower runs against the app as the README says, and shows the queue and its tasks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet import run_id_of

# Every test here runs `celery flower` (and workers) against Redis.
pytestmark = pytest.mark.fleet

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def flower(redis_db: str, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
        "AGENTTEST_BROKER_URL": redis_db,
        "AGENTTEST_HOME": str(tmp_path / "home"),
    }
    log = (tmp_path / "flower.log").open("w")
    proc = subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "agenttest_worker",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            "--basic-auth=admin:secret",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"flower exited: {(tmp_path / 'flower.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("flower did not answer /healthcheck within 30 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_flower_serves_the_agenttest_app_behind_basic_auth(flower: str, redis_db: str) -> None:
    assert httpx.get(f"{flower}/api/workers", timeout=5).status_code == 401
    auth = ("admin", "secret")
    workers = httpx.get(f"{flower}/api/workers", auth=auth, timeout=10)
    assert workers.status_code == 200
    # Its task registry is the app's: the turn, start and aggregate tasks are known.
    page = httpx.get(f"{flower}/tasks", auth=auth, timeout=10)
    assert page.status_code == 200
    # The Broker page's queue length: a turn waiting in the agenttest queue is what a
    # nightly run's backlog looks like there.
    from celery import Celery

    app = Celery(broker=redis_db)
    for case in ("a", "b"):
        app.send_task("agenttest.turn", args=("run-x", case, 1), queue="agenttest")
    lengths = httpx.get(f"{flower}/api/queues/length", auth=auth, timeout=10)
    assert lengths.status_code == 200
    queues = {q["name"]: q["messages"] for q in lengths.json()["active_queues"]}
    assert queues.get("agenttest") == 2


def test_flower_shows_the_turns_of_a_run_on_workers_with_default_settings(
    flower: str, redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Workers send no task events by default; Flower turns them on in the workers it
    watches, and then lists each turn task with its (run, case, turn) arguments."""
    from fleet import fleet_on, greeting_case, write_cases, write_project

    (tmp_path / "fleet").mkdir()
    fleets = fleet_on(redis_db, pg_database, demo_url, tmp_path / "fleet")
    fleet = next(fleets)
    try:
        fleet.start("w", concurrency=2)
        config = write_project(tmp_path / "fleet", demo_url, name="expense")
        auth = ("admin", "secret")
        deadline = time.monotonic() + 60
        seen: dict[str, Any] = {}
        run_ids: list[str] = []
        # Flower enables events every few seconds: a run finished before that is not
        # in its list, so submit small runs until one shows up.
        while time.monotonic() < deadline and not seen:
            cases = write_cases(tmp_path, [greeting_case(f"F{len(run_ids)}")])
            done = fleet.submit(["-i", str(cases), "-n", "expense", "--config", str(config)])
            assert done.returncode == 0, done.stderr
            run_ids.append(run_id_of(done.stderr))
            time.sleep(1.0)
            tasks = httpx.get(
                f"{flower}/api/tasks", params={"taskname": "agenttest.turn"}, auth=auth, timeout=10
            ).json()
            seen = {
                task["args"]: task
                for task in tasks.values()
                if any(run_id in task["args"] for run_id in run_ids)
            }
        assert seen, f"no turn of runs {run_ids} appeared in Flower within 60 s"
        task = next(iter(seen.values()))
        assert task["state"] == "SUCCESS"
        assert "turn 1: case passed" in task["result"]
    finally:
        fleets.close()
