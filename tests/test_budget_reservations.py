"""Budgets hold on a fleet: a turn reserves its estimated usage before it calls, so turns
running at once cannot all see the budget unspent (store/reservations.py).

The issue's scenario: --max-tokens 40, cases of one 15-token turn, 2 workers of 4
threads. Before reservations, all 8 threads' turns ran at once (120 tokens). Now the
first turn runs alone (nothing is known of a turn's usage yet), then turns reserve its
average while spent plus reserved is under 40: the run ends at 45 tokens, 5 over, by the
turns already running when it ran out, and the summary says so. Embedded the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on, run_id_of, write_cases
from scripted_agent import ScriptedAgent, say

from agenttest_submit.cli.main import main
from agenttest_worker.report.aggregation import build_report

BUDGET, PER_TURN = 40, 15  # the scripted agent's usage is 15 tokens a call


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        # Slow enough that the threads' turns would all be in flight at once.
        served.script("target", lambda body: say("Hello there", delay=0.4))
        yield served


def _suite(tmp_path: Path, agent: ScriptedAgent, count: int) -> tuple[Path, Path]:
    config = tmp_path / "agenttest.yaml"
    entry = agent.entry("target", timeout=10, max_retries=0)
    config.write_text(json.dumps({"agents": {"target": entry}}), encoding="utf-8")
    cases = [
        {"id": f"B{i:02}", "input": "Hi", "assertions": [{"type": "contains", "value": "Hello"}]}
        for i in range(count)
    ]
    return config, write_cases(tmp_path, cases)


def _check(records: list[dict], console: str, summary: dict, calls: int) -> None:
    ran = [r for r in records if r["status"] == "passed"]
    skipped = [r for r in records if r["status"] == "skipped"]
    tokens = sum(r["usage"]["total_tokens"] for r in ran if r.get("usage"))
    assert calls == len(ran)  # a skipped case called no agent
    # The budget ran out with at most two turns in flight (15 spent + 15 reserved < 40
    # lets a third start; 15 + 30 = 45 does not): the overshoot is theirs alone.
    assert len(ran) <= 3, [r["id"] for r in ran]
    assert BUDGET <= tokens <= BUDGET + PER_TURN * 2
    assert len(skipped) == len(records) - len(ran) > 0
    for record in skipped:
        assert record["skip_reason"].startswith(
            f"not run: the run's token budget ({BUDGET}) was spent"
        ), record["skip_reason"]
        assert record["total_turns"] == 0
    over = tokens - BUDGET
    line = f"Budget: {tokens} of {BUDGET} tokens used"
    if over:
        line += f" ({over} over: turns already running when it ran out)"
    assert line in console, console
    assert summary["budget"] == {"max_tokens": BUDGET, "tokens_used": tokens, "tokens_over": over}


@pytest.mark.fleet
def test_fleet_budget_overshoots_only_by_turns_in_flight(
    fleet: Fleet, agent: ScriptedAgent, tmp_path: Path
) -> None:
    config, cases = _suite(tmp_path, agent, 12)
    for name in ("a", "b"):
        fleet.start(name, concurrency=4, wait=False)
    for worker in fleet.workers:
        worker.wait_ready()
    out = tmp_path / "results.jsonl"
    args = ["-i", str(cases), "-n", "target", "--config", str(config), "-o", str(out)]
    done = fleet.submit([*args, "--max-tokens", str(BUDGET)])
    assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]  # stopped by its budget
    records = [json.loads(line) for line in out.read_text().splitlines()]
    summary = build_report(fleet.database_url, run_id_of(done.stderr)).summary().as_dict()
    _check(records, done.stdout, summary, len(agent.requests("target")))


def test_embedded_budget_overshoots_only_by_turns_in_flight(
    agent: ScriptedAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = _suite(tmp_path, agent, 12)
    out, report = tmp_path / "results.jsonl", tmp_path / "report.json"
    args = ["-i", str(cases), "-n", "target", "--config", str(config), "--parallel", "8"]
    # A run its budget stopped exits 1: its cases not played are not tested.
    assert main([*args, "--max-tokens", str(BUDGET), "-o", str(out)]) == 1
    console = capsys.readouterr().out
    # Its report exits as the run did.
    assert main(["report", "last", "--format", "json", "-o", str(report)]) == 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    summary = json.loads(report.read_text())["summary"]
    _check(records, console, summary, len(agent.requests("target")))
