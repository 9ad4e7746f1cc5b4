"""GitHub Actions on a fleet: the submitter waiting on the workers ends the run as an
embedded one does (tests/test_github_ci.py): an annotation per failed case at its line,
the Markdown summary, the step's outputs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on

pytestmark = pytest.mark.fleet

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_a_fleet_run_on_github_annotates_and_summarises(fleet: Fleet, tmp_path: Path) -> None:
    shutil.copy(SUITE / "agenttest.yaml", tmp_path / "agenttest.yaml")
    cases = tmp_path / "cases"
    cases.mkdir()
    hostile = {
        "id": "T005",
        "name": "a\n::warning::b",
        "input": "Hello",
        "assertions": [{"type": "contains", "value": "refund"}],
    }
    lines = (SUITE / "expense-suite.jsonl").read_text().splitlines()
    (cases / "suite.jsonl").write_text("\n".join([lines[0], lines[3], json.dumps(hostile)]) + "\n")
    summary, outputs = tmp_path / "summary.md", tmp_path / "outputs.txt"
    fleet.env.update(
        GITHUB_ACTIONS="true",
        GITHUB_WORKSPACE=str(tmp_path),
        GITHUB_STEP_SUMMARY=str(summary),
        GITHUB_OUTPUT=str(outputs),
    )
    fleet.start("gh", concurrency=2)
    done = fleet.submit(["-i", "cases/suite.jsonl", "-n", "assistants.expense", "--suite", "gh"])
    assert done.returncode == 1, done.stderr
    commands = [line for line in done.stderr.splitlines() if line.startswith("::")]
    assert commands == [
        "::error file=cases/suite.jsonl,line=2,title=agenttest%3A T004 Greeting mentions "
        'refunds failed::turn 1: contains "refund": reply does not contain "refund"; reply '
        'was "Hello! I can help you submit expense reports."',
        "::error file=cases/suite.jsonl,line=3,title=agenttest%3A T005 a\\x0a%3A%3Awarning"
        '%3A%3Ab failed::turn 1: contains "refund": reply does not contain "refund"; reply '
        'was "Hello! I can help you submit expense reports."',
    ]
    text = summary.read_text()
    assert text.startswith("### agenttest — failed\n") and "| 3 | 1 | 2 | 0 |" in text
    assert "**T004** — Greeting mentions refunds (cases/suite\\.jsonl:2)" in text
    found = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert found["exit-code"] == "1" and found["run-id"]
    assert done.stdout.count("► [T004]") == 1  # the report on stdout, the commands not in it
    assert "::error" not in done.stdout
