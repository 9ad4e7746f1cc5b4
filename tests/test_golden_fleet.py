"""Golden conversations on a fleet: a Celery worker over Redis and Postgres plays the
cases; the submitter records the golden files from the stored records, and reads them
into the cases it stores, so that the workers compare without the submitter's disk.
The embedded runs are tests/test_golden.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent
from test_golden import GOLDEN_G1, MOCKS, Travel, trip

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _records(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def _golden(record: dict[str, Any]) -> dict[str, Any]:
    [found] = [a for a in record["final_assertions"] if a["type"] == "golden"]
    return found


def test_record_then_compare_on_the_fleet(fleet: Fleet, demo_url: str, tmp_path: Path) -> None:
    fleet.start("w", concurrency=2)
    travel = Travel()
    with ScriptedAgent() as agent:
        agent.script("travel", travel)
        config = {
            "agents": {
                "travel": agent.entry("travel", max_retries=0),
                "validator": {"protocol": "openai", "base_url": demo_url, "model": "validator"},
            },
            "defaults": {"judge": "validator"},
        }
        config_path = tmp_path / "agenttest.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        cases = tmp_path / "cases.jsonl"
        lines = [
            trip({"type": "golden", "match": "exact"}),
            trip({"type": "golden", "match": "judge"}, case_id="G3"),
            trip(case_id="G4"),
            {
                "id": "F",
                "input": "a flight",
                "tool_mocks": MOCKS,
                "assertions": [{"type": "contains", "value": "Rome"}],
            },
        ]
        cases.write_text("".join(json.dumps(c) + "\n" for c in lines), encoding="utf-8")
        args = ["-i", str(cases), "-n", "travel", "--config", str(config_path)]

        recorded = fleet.submit([*args, "--update-golden"])
        assert recorded.returncode == 1, recorded.stderr + fleet.logs()[-4000:]
        folder = tmp_path / "cases.jsonl.golden"
        assert sorted(p.name for p in folder.iterdir()) == ["G1.json", "G3.json", "G4.json"]
        assert (folder / "G1.json").read_text(encoding="utf-8") == GOLDEN_G1
        assert "golden: 3 conversation(s) recorded" in recorded.stderr

        travel.wording = "Good news: I found flight AF123 to Paris."
        out = tmp_path / "compare.jsonl"
        compared = fleet.submit(
            [*args, "--golden", "exact", "--id", "G1", "--id", "G3", "--id", "G4", "-o", str(out)]
        )
        assert compared.returncode == 1, compared.stderr + fleet.logs()[-4000:]
    records = _records(out)
    exact = _golden(records["G1"])
    assert not exact["passed"]
    assert exact["reason"].startswith("turn 1: the reply differs from the golden one: golden ")
    # The golden conversation travelled in the stored case, as the submitter read it.
    assert exact["golden_file"] == f"{cases}.golden/G1.json"
    assert exact["recorded"]["turns"][0]["reply"] == "I found flight AF123 to Paris."
    judged = _golden(records["G3"])
    assert judged["passed"] and judged["match"] == "judge", judged
    added = _golden(records["G4"])
    assert added["match"] == "exact" and not added["passed"]
