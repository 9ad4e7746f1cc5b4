"""The command line on a fleet (real `celery worker` processes, Redis, Postgres): input
errors refused before anything is stored, cases from standard input, and the run id
alone on stdout with --no-wait. The embedded default: test_command_line.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on
from sqlalchemy import func, select

from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import RunRow

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")
ARGS = ["-n", "assistants.expense", "--config", SUITE_CONFIG]


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def run_count(url: str) -> int:
    with session_scope(url) as session:
        return int(session.scalar(select(func.count()).select_from(RunRow)) or 0)


@pytest.mark.fleet
def test_input_errors_on_a_fleet_store_nothing(fleet: Fleet) -> None:
    before = run_count(fleet.database_url)
    for args, said in [
        (
            ["-i", "cases/expense.jsnl", *ARGS],
            "-i: case file or folder not found: cases/expense.jsnl",
        ),
        (["-i", "nosuchdir", *ARGS], "-i: no case file or folder named 'nosuchdir'"),
        (
            [
                "-i",
                SUITE_CASES,
                *ARGS,
                "-n",
                "workers.test.validator",
                "--repeat",
                "auto",
                "--max-repeat",
                "3",
            ],
            "--repeat: cannot be combined with several -n targets",
        ),
    ]:
        done = fleet.submit(args)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and "Traceback" not in done.stderr
        assert done.stdout == ""
    assert run_count(fleet.database_url) == before


@pytest.mark.fleet
def test_no_wait_prints_the_run_id_alone_on_a_fleet(fleet: Fleet) -> None:
    """RUN=$(agenttest-submit ... --no-wait) is the run id; cases from standard input."""
    fleet.start("w", concurrency=2)
    script = (
        f'RUN=$("{sys.executable}" -m agenttest_submit.cli -i - {" ".join(ARGS)} --no-wait '
        f'< "{SUITE_CASES}") && echo "run=[$RUN]"'
    )
    done = subprocess.run(
        ["bash", "-c", script],
        env=fleet.env,
        cwd=fleet.workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("run=[") and done.stdout.endswith("]\n")
    run_id = done.stdout[len("run=[") : -2]
    assert "case(s) enqueued" in done.stderr  # everything else went to stderr
    fleet.wait_done(run_id)
    run = runs.get_run(fleet.database_url, run_id)
    assert run is not None
    ids = [json.loads(line)["id"] for line in Path(SUITE_CASES).read_text().splitlines()]
    assert run.total_cases == len(ids) and run.input_label == "<stdin>"


@pytest.mark.fleet
def test_view_on_a_port_in_use_on_a_fleet_says_so(fleet: Fleet) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = fleet.submit(["view", "--port", str(port)])
    assert done.returncode == 2, done.stderr
    assert f"--port: port {port} on 127.0.0.1 is in use" in done.stderr
    assert "--port 0 for any free one" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


@pytest.mark.fleet
def test_options_pasted_from_a_run_on_a_fleet(fleet: Fleet) -> None:
    fleet.start("w", concurrency=2)
    run_id = fleet.submit_no_wait(["-i", SUITE_CASES, *ARGS])
    fleet.wait_done(run_id)
    junit = fleet.workdir / "junit.xml"
    done = fleet.submit(["report", run_id, "--format", "junit", "-o", str(junit)])
    assert done.returncode in (0, 1), done.stderr
    assert junit.read_text(encoding="utf-8").startswith("<?xml")
    refused = fleet.submit(["status", run_id, "--config", SUITE_CONFIG, "--format", "json"])
    assert refused.returncode == 2 and refused.stdout == ""
    assert "  --config: not used by status: status reads the store" in refused.stderr
    assert "  --format: not used by status: " in refused.stderr  # every problem at once
