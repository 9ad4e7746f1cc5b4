"""Two targets in one run on a fleet: one Celery worker over Redis and Postgres plays
every case against each target, and the run's records, reports and target diff are
the embedded run's (tests/test_two_targets.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent, last_user_text
from test_two_targets import CASES, QUESTIONS, _bad, _records

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_two_targets_on_a_fleet_give_the_embedded_records(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start("w", concurrency=2)
    with ScriptedAgent() as agent:
        agent.script("good", lambda body: "right answer")
        agent.script("bad", _bad)
        entries = {name: agent.entry(name, max_retries=0) for name in ("good", "bad")}
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": entries}), encoding="utf-8")
        cases = tmp_path / "cases.jsonl"
        cases.write_text("".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8")
        args = ["-i", str(cases), "--config", str(config), "-n", "good", "-n", "bad"]

        out = tmp_path / "out.jsonl"
        done = fleet.submit([*args, "--repeat", "2", "-o", str(out), "--format", "jsonl"])
        assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]
        assert sorted(last_user_text(b) for b in agent.requests("good")) == sorted(QUESTIONS * 2)
        assert sorted(last_user_text(b) for b in agent.requests("bad")) == sorted(QUESTIONS * 2)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 12
    assert _records(out.read_text(encoding="utf-8")) == {
        ("T1", "good"): "passed",
        ("T2", "good"): "passed",
        ("T3", "good"): "passed",
        ("T1", "bad"): "passed",
        ("T2", "bad"): "failed",
        ("T3", "bad"): "passed",
    }
    # Every repetition of each target, in order: a case's records stay together.
    order = [(r["id"], r["agent"], r["repeat"]) for r in map(json.loads, lines)]
    assert order[:4] == [("T1", "good", 1), ("T1", "good", 2), ("T1", "bad", 1), ("T1", "bad", 2)]

    # The run is labelled with both targets.
    listed = fleet.submit(["runs", "--format", "json"])
    assert listed.returncode == 0, listed.stderr
    [run_id] = [r["run_id"] for r in json.loads(listed.stdout) if r["agent"] == "good, bad"]
    report = fleet.submit(["report", run_id, "--format", "json"])
    document = json.loads(report.stdout)
    cases_by_id = {c["id"]: c["targets"] for c in document["cases"]}
    failed = {"status": "failed", "passed": 0, "repeats": 2, "flaky": False}
    assert cases_by_id["T2"]["bad"] == failed
    diff = fleet.submit(["diff", run_id, "--targets", "good", "bad", "--format", "json"])
    assert diff.returncode == 1, diff.stderr
    categories = {c["id"]: c["category"] for c in json.loads(diff.stdout)["cases"]}
    assert categories == {"T1": "still_passing", "T2": "regression", "T3": "still_passing"}
