"""The reply cache on a fleet: two Celery workers over Redis and Postgres share it. A
second identical run calls its stable judge 0 times, and two workers asking the judge
the same thing at once call it once (the first holds the lease, the other waits for its
reply). The embedded runs are tests/test_reply_cache.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent, judge_verdict, say

from agenttest_worker.store.sql.cached_replies import SqlReplyCache

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    SqlReplyCache(pg_database).clear()  # the session's database: no earlier test's replies
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _project(tmp_path: Path, agent: ScriptedAgent, cases: list[dict[str, Any]]) -> list[str]:
    config = {
        "agents": {
            "bot": agent.entry("target"),
            "grader": agent.entry("judge", params={"temperature": 0}, timeout=10),
        },
        "defaults": {"judge": "agents:grader"},
    }
    config_path = tmp_path / "agenttest.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    cases_path = tmp_path / "cases.jsonl"
    cases_path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return ["-i", str(cases_path), "-n", "bot", "--config", str(config_path)]


def _judged(case_id: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": f"question {case_id}",
        "assertions": [{"type": "agent", "options": {"metadata": {"criteria": "answers"}}}],
    }


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_second_run_on_the_fleet_calls_the_judge_zero_times(fleet: Fleet, tmp_path: Path) -> None:
    for name in ("a", "b"):
        fleet.start(name, concurrency=2, wait=False)
    for worker in fleet.workers:
        worker.wait_ready()
    with ScriptedAgent() as agent:
        agent.script("target", lambda body: "an answer")
        agent.script("judge", lambda body: judge_verdict(True, "it answers"))
        args = _project(tmp_path, agent, [_judged(f"c{n}") for n in range(4)])
        first = fleet.submit([*args, "-o", str(tmp_path / "a.jsonl"), "--format", "jsonl"])
        assert first.returncode == 0, first.stderr + fleet.logs()[-4000:]
        assert len(agent.requests("judge")) == 4
        second = fleet.submit([*args, "-o", str(tmp_path / "b.jsonl"), "--format", "jsonl"])
        assert second.returncode == 0, second.stderr + fleet.logs()[-4000:]
        assert len(agent.requests("judge")) == 4
        assert len(agent.requests("target")) == 8
    for record in _records(tmp_path / "b.jsonl"):
        assert record["usage_by_role"]["judge"] == {
            "calls": 1,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
            "cost": 0.0,
            "cached": 1,
        }


def test_two_workers_racing_on_one_identical_request_call_the_judge_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    for name in ("a", "b"):
        fleet.start(name, concurrency=1, wait=False)
    for worker in fleet.workers:
        worker.wait_ready()
    with ScriptedAgent() as agent:
        agent.script("target", lambda body: "an answer")
        # Slow: the second repetition's identical request comes while the first waits.
        agent.script("judge", lambda body: say('{"passed": true, "reason": "ok"}', delay=1.5))
        args = _project(tmp_path, agent, [_judged("same")])
        out = tmp_path / "out.jsonl"
        done = fleet.submit([*args, "--repeat", "2", "-o", str(out), "--format", "jsonl"])
        assert done.returncode == 0, done.stderr + fleet.logs()[-4000:]
        assert len(agent.requests("target")) == 2  # each repetition asked the target
        assert len(agent.requests("judge")) == 1
    records = _records(out)
    assert len(records) == 2
    cached = [r["usage_by_role"]["judge"].get("cached", 0) for r in records]
    assert sorted(cached) == [0, 1]
    # Both workers played one repetition each: the wait was across processes.
    assert "a" in fleet.logs() and "b" in fleet.logs()
