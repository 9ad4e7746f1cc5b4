"""The pytest plugin on a fleet: with AGENTTEST_BROKER_URL set, each item's run is
played by the workers, and pytest reports it as it reports an embedded one
(tests/test_pytest_plugin.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on

pytestmark = pytest.mark.fleet

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_pytest_plays_the_cases_on_the_fleet(fleet: Fleet, tmp_path: Path) -> None:
    shutil.copy(SUITE / "agenttest.yaml", tmp_path / "agenttest.yaml")
    cases = tmp_path / "cases"
    cases.mkdir()
    lines = (SUITE / "expense-suite.jsonl").read_text().splitlines()
    (cases / "suite.agenttest.jsonl").write_text(f"{lines[0]}\n{lines[3]}\n")
    fleet.start("plugin", concurrency=2)
    before = _run_ids(fleet)
    junit = tmp_path / "results.xml"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "cases"),
            *("--agenttest-agent", "assistants.expense", f"--junitxml={junit}"),
        ],
        env=fleet.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert "► [T004] Greeting mentions refunds (1 turn)" in done.stdout
    outcomes = {
        c.get("name"): [e.tag for e in c] for c in ET.parse(junit).getroot().iter("testcase")
    }
    assert outcomes == {"T001": [], "T004": ["failure"]}
    # A run per item, in the fleet's store (the session's database: others' runs too).
    assert len(_run_ids(fleet) - before) == 2


def _run_ids(fleet: Fleet) -> set[str]:
    runs = fleet.submit(["runs", "--format", "json", "--last", "10000"])
    assert runs.returncode == 0, runs.stderr
    return {run["run_id"] for run in json.loads(runs.stdout)}
