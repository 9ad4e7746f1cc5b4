"""Run budgets: --max-tokens and --max-cost stop new turns once spent, and say so."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.agents.config import AgentConfig, Pricing, ProjectConfig
from agenttest_worker.driver.budget_counting import budget_spent, calls_cost
from agenttest_worker.engine import RunOptions
from agenttest_worker.results import AgentCallRecord, Usage


def _suite(tmp_path: Path, demo_url: str, count: int) -> tuple[Path, Path]:
    config = tmp_path / "agenttest.yaml"
    config.write_text(
        "agents:\n"
        "  expense:\n"
        f"    base_url: {demo_url}\n"
        "    model: expense\n"
        "    pricing: {prompt_per_million: 1000, completion_per_million: 2000}\n"
    )
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"B{i}",
                    "input": "Hello",
                    "assertions": [{"type": "contains", "value": "expense"}],
                }
            )
            + "\n"
            for i in range(count)
        )
    )
    return config, cases


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_max_tokens_stops_new_turns_and_says_why(
    tmp_path: Path, demo_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = _suite(tmp_path, demo_url, 6)
    out = tmp_path / "results.jsonl"
    # Each demo call uses a few dozen tokens: a budget of 1 is spent by the first turn.
    code = main(
        [
            "-i",
            str(cases),
            "-n",
            "expense",
            "--config",
            str(config),
            "--parallel",
            "1",
            "--max-tokens",
            "1",
            "-o",
            str(out),
        ]
    )
    assert code == 1  # nothing failed, but the rest was not run: not every case was tested
    records = _records(out)
    assert [r["status"] for r in records] == ["passed"] + ["skipped"] * 5
    assert records[0]["usage"]["total_tokens"] > 1
    for record in records[1:]:
        assert record["skip_reason"].startswith("not run: the run's token budget (1) was spent")
        assert record["total_turns"] == 0
    assert "token budget (1) was spent" in capsys.readouterr().out
    # In JUnit the cases not run are errors: not tested, neither passed nor skipped.
    assert main(["report", "last", "--format", "junit"]) == 1
    suite = ET.fromstring(capsys.readouterr().out.encode()).find("testsuite")
    assert suite is not None
    assert (suite.get("errors"), suite.get("skipped")) == ("5", "0")
    errors = [e for e in suite.iter("error") if e.get("type") == "not_run"]
    assert len(errors) == 5


def test_max_cost_uses_each_agents_pricing(
    tmp_path: Path, demo_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = _suite(tmp_path, demo_url, 4)
    out = tmp_path / "results.jsonl"
    # At 1000/2000 per million tokens, one demo call costs a few hundredths: 0.05 lasts
    # one or two turns, never all four.
    code = main(
        [
            "-i",
            str(cases),
            "-n",
            "expense",
            "--config",
            str(config),
            "--parallel",
            "1",
            "--max-cost",
            "0.05",
            "-o",
            str(out),
        ]
    )
    assert code == 1  # stopped by its budget before every case was tested
    statuses = [r["status"] for r in _records(out)]
    assert statuses[0] == "passed"
    assert "skipped" in statuses
    skipped = [r for r in _records(out) if r["status"] == "skipped"]
    assert all("cost budget (0.05) was spent" in r["skip_reason"] for r in skipped)


def test_without_a_budget_every_case_runs(tmp_path: Path, demo_url: str) -> None:
    config, cases = _suite(tmp_path, demo_url, 3)
    out = tmp_path / "results.jsonl"
    assert main(["-i", str(cases), "-n", "expense", "--config", str(config), "-o", str(out)]) == 0
    assert [r["status"] for r in _records(out)] == ["passed"] * 3


def test_cost_of_calls_and_budget_messages() -> None:
    config = ProjectConfig(
        agents={
            "priced": AgentConfig(
                base_url="http://x/v1",
                pricing=Pricing(prompt_per_million=2.0, completion_per_million=10.0),
            ),
            "free": AgentConfig(base_url="http://x/v1"),
        }
    )
    calls = [
        AgentCallRecord(
            role="target",
            agent="priced",
            latency_ms=1,
            usage=Usage(prompt_tokens=1_000_000, completion_tokens=500_000, total_tokens=1_500_000),
        ),
        AgentCallRecord(
            role="validator",
            agent="free",
            latency_ms=1,
            usage=Usage(prompt_tokens=10, completion_tokens=10, total_tokens=20),
        ),
    ]
    assert calls_cost(calls, config) == pytest.approx(2.0 + 5.0)
    options = RunOptions(max_tokens=100, max_cost=1.5)
    assert budget_spent(options, 99, 1.0) is None
    assert "token budget (100)" in (budget_spent(options, 100, 0.0) or "")
    assert "cost budget (1.5)" in (budget_spent(options, 0, 1.5) or "")
