"""Reruns on a fleet: `--suite S --rerun-failed` reads the suite's newest finished run in
the fleet's Postgres store and plays only its failed cases on the workers, as an
embedded rerun does (tests/test_rerun.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent, last_user_text

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _statuses(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r["status"] for r in map(json.loads, lines)}


def test_rerun_failed_on_a_fleet_plays_only_the_failures(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start("rerun", concurrency=2)
    with ScriptedAgent() as agent:
        config = tmp_path / "agenttest.yaml"
        config.write_text(
            json.dumps({"agents": {"bot": agent.entry("bot", max_retries=0)}}), encoding="utf-8"
        )
        cases = tmp_path / "cases.jsonl"
        cases.write_text(
            "".join(
                json.dumps(
                    {
                        "id": i,
                        "input": f"question {i}",
                        "assertions": [{"type": "contains", "value": "right"}],
                    }
                )
                + "\n"
                for i in "abcd"
            ),
            encoding="utf-8",
        )
        right = {"a", "c"}

        def rule(body: dict[str, Any]) -> str:
            return "right" if last_user_text(body).split()[-1] in right else "wrong"

        agent.script("bot", rule)
        # The session's database holds other tests' runs: a suite of this test's own.
        suite = f"rerun-{tmp_path.name}"
        args = ["-i", str(cases), "-n", "bot", "--config", str(config), "--suite", suite]
        first = fleet.submit([*args, "-o", str(tmp_path / "a.jsonl"), "--format", "jsonl"])
        assert first.returncode == 1, first.stderr + fleet.logs()[-4000:]
        assert _statuses(tmp_path / "a.jsonl")["b"] == "failed"
        assert len(agent.requests("bot")) == 4

        right = {"a", "b", "c", "d"}
        second = fleet.submit(
            [*args, "--rerun-failed", "-o", str(tmp_path / "b.jsonl"), "--format", "jsonl"]
        )
        assert second.returncode == 0, second.stderr + fleet.logs()[-4000:]
        assert _statuses(tmp_path / "b.jsonl") == {"b": "passed", "d": "passed"}
        asked = sorted(last_user_text(body) for body in agent.requests("bot")[4:])
        assert asked == ["question b", "question d"]
        assert "rerunning 2 cases of run" in second.stderr

        # The suite's newest finished run is now the rerun, which failed nothing.
        third = fleet.submit([*args, "--rerun-failed"])
        assert third.returncode == 0, third.stderr
        assert "nothing to rerun" in third.stderr and "has no failed case" in third.stderr
        unknown = fleet.submit([*args, "--rerun-failed", "no-such-run"])
        assert unknown.returncode == 2 and "no run 'no-such-run'" in unknown.stderr
        assert "Traceback" not in unknown.stderr
        assert len(agent.requests("bot")) == 6
