"""Failure attribution and the noise-aware gate on a fleet: one Celery worker over Redis
and Postgres plays the suite of tests/test_failure_causes.py (agents with known
behaviour: a wrong target, a judge that disagrees with itself, a simulator that errors,
a 503, a timeout, an unreachable judge, missing input, a coin flip, a flaky
connection), and every record, summary and diff says why its cases failed, as embedded
runs do. A second night whose
one drop is a single play passes `--fail-on regressions --confidence 0.95`: likely
regressed, not significant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent
from test_failure_causes import EXPECTED, SUMMARY, Project, script

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_causes_and_the_noise_aware_gate_on_a_fleet(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start("causes", concurrency=4)
    with ScriptedAgent() as agent:
        script(agent)
        project = Project(agent, tmp_path)
        out = tmp_path / "out.jsonl"
        first = fleet.submit(project.args("-o", str(out), "--suite", f"causes-{tmp_path.name}"))
        assert first.returncode == 1, first.stderr + fleet.logs()[-4000:]
        records = _records(out)
        causes = {r["id"]: r.get("cause") for r in records if r.get("repeats") is None}
        assert causes == {"fine": None, **EXPECTED}, records
        coin = sorted((r["status"], r.get("cause")) for r in records if r["id"] == "coin")
        assert coin == [("failed", "flake"), ("passed", None)]
        link = sorted((r["status"], r.get("cause")) for r in records if r["id"] == "flaky-link")
        assert link == [("failed", "infrastructure"), ("passed", None)]
        assert "Causes: 1 agent, 1 judge, 3 simulator, 4 infrastructure, 1 flake, 1 input" in (
            first.stdout
        )
        # Night two: the fine case fails its single play. Not significant: exit 0.
        script(agent, fine="wrong")
        gate = ("--fail-on", "regressions", "--confidence", "0.95")
        second = fleet.submit(project.args("--suite", f"causes-{tmp_path.name}", *gate))
        assert second.returncode == 0, second.stdout + second.stderr + fleet.logs()[-4000:]
        assert "Likely regressed (1)" in second.stdout and "p = 0.5" in second.stdout
        assert "1 case likely regressed" in second.stderr
        assert "Failing now, by cause: 2 agent, 1 judge" in second.stdout
    diff = fleet.submit(["diff", "--confidence", "0.95", "--format", "json"])
    document = json.loads(diff.stdout)
    assert document["causes"] == {**SUMMARY, "agent": 2}
    fine = next(c for c in document["cases"] if c["id"] == "fine")
    assert fine["category"] == "likely_regression" and fine["cause"] == "agent"
    assert fine["stats"]["p_value"] == 0.5
    # The suite's history pooled as the baseline, read from Postgres.
    pooled = fleet.submit(["diff", "--history-window", "5", "--format", "json"])
    assert pooled.returncode == 0, pooled.stderr
    fine = next(c for c in json.loads(pooled.stdout)["cases"] if c["id"] == "fine")
    assert fine["category"] == "likely_regression"
    assert fine["stats"]["then"]["runs"] == 1 and json.loads(pooled.stdout)["history_window"] == 5
