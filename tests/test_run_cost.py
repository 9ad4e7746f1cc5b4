"""A run's cost, budget or not: `runs.total_cost` follows its conversations' usage (and
stays exact under a budget), and the run's whole cost (its generators' and reporter's
too) is what `runs`, the exporter's `agenttest_run_cost`, the viewer's runs page and
the HTML report show; `--dry-run` says the calls a run will make and their estimated
cost.

Embedded, over real HTTP, against agents that report usage and count what they
reported (usage_kit.py); the fleet's total is checked in
tests/test_usage_by_role_fleet.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import chromium, environment, open_page
from fleet import wait_until
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.exc import OperationalError
from test_metrics import samples, total
from test_viewer import Viewer
from usage_kit import PRICING, UsageAgents, write_suite

from agenttest_submit.cli.main import main
from agenttest_submit.commands.metrics_exporter import FleetCollector
from agenttest_worker.results import RoleUsage, UsageRole
from agenttest_worker.settings import get_settings
from agenttest_worker.store import RunRow
from agenttest_worker.store.sql import runs, usage


@pytest.fixture
def agents() -> Iterator[UsageAgents]:
    with UsageAgents() as served:
        yield served


def _cost(used: dict[UsageRole, RoleUsage]) -> float:
    return sum(u.cost for u in used.values())


def _tokens(used: dict[UsageRole, RoleUsage]) -> int:
    return sum(u.total_tokens for u in used.values())


def _latest() -> RunRow:
    run = runs.latest_run(get_settings().effective_database_url())
    assert run is not None
    return run


def _run(config: Path, cases: Path, *more: str) -> RunRow:
    args = ["-i", str(cases), "-n", "target", "--config", str(config), *more]
    assert main(args) == 0
    return _latest()


@pytest.mark.parametrize("budget", [[], ["--max-cost", "100"], ["--max-tokens", "10000000"]])
def test_total_cost_is_what_the_conversations_used_budget_or_not(
    agents: UsageAgents, tmp_path: Path, budget: list[str]
) -> None:
    """Without a budget a case's cost is added as it ends; under one, turn by turn: the
    same total either way, never counted twice."""
    config, cases = write_suite(tmp_path, agents)
    run = _run(config, cases, *budget)
    in_cases = [agents.counted(case) for case in ("A", "S")]
    assert run.total_cost == pytest.approx(sum(map(_cost, in_cases)), abs=1e-9)
    assert run.total_cost > 0
    assert run.total_tokens == sum(map(_tokens, in_cases))


def test_cached_replies_cost_nothing_in_the_runs_total(agents: UsageAgents, tmp_path: Path) -> None:
    """The judge at temperature 0: the suite's second run in the same store is served
    every verdict from the reply cache, and its total is what its targets and
    simulator cost."""
    config, cases = write_suite(tmp_path, agents)
    project = json.loads(config.read_text(encoding="utf-8"))
    project["agents"]["judge"]["params"] = {"temperature": 0}
    config.write_text(json.dumps(project), encoding="utf-8")
    first = _run(config, cases)
    assert first.total_cost == pytest.approx(_cost(agents.counted_all()), abs=1e-9)
    agents.reset()
    second = _run(config, cases)
    made = agents.counted_all()
    assert "judge" not in made and set(made) == {"target", "simulator"}
    assert second.total_cost == pytest.approx(_cost(made), abs=1e-9)
    assert 0 < second.total_cost < first.total_cost
    assert second.total_tokens == _tokens(made)


def test_runs_lists_the_whole_cost_with_generators_and_reporter(
    agents: UsageAgents, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = write_suite(tmp_path, agents)
    run = _run(config, cases, "-i", "agents:gen?count=1", "--reporter", "agents:reporter")
    in_cases = [agents.counted(case) for case in ("A", "S", "G1")]
    assert run.total_cost == pytest.approx(sum(map(_cost, in_cases)), abs=1e-9)
    whole = _cost(agents.counted_all())
    assert set(agents.counted(None)) == {"generator", "reporter"}
    assert usage.run_cost(run.total_cost, run.usage) == pytest.approx(whole, abs=1e-9)

    capsys.readouterr()
    assert main(["runs", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["run_id"] == run.id
    assert listed[0]["cost"] == pytest.approx(whole, abs=1e-9)
    assert main(["runs"]) == 0
    head, row = capsys.readouterr().out.splitlines()[:2]
    assert head.split()[-2:] == ["COST", "SUITE"]
    assert row.startswith(run.id) and f"  {whole:.4f}  " in row, row


def test_the_exporter_shows_the_cost_of_a_run_under_way(
    agents: UsageAgents, tmp_path: Path
) -> None:
    """S's target holds its answer: the run is running, A has ended, and the exporter's
    agenttest_run_cost is A's cost, with no budget."""
    config, cases = write_suite(tmp_path, agents, timeout=120)
    s_answers = agents.hold("S")
    command = [sys.executable, "-m", "agenttest_submit.cli", "-i", str(cases), "-n", "target"]
    submitter = subprocess.Popen(
        [*command, "--config", str(config), "--parallel", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = get_settings().effective_database_url()

    def a_cost() -> float | None:
        try:
            run = runs.latest_run(url) if Path(url.removeprefix("sqlite:///")).exists() else None
        except OperationalError:  # the submitter is still creating the store's tables
            return None
        return run.total_cost if run is not None and run.total_cost else None

    try:
        try:
            wait_until(a_cost, 90, "A's cost to be stored", step=0.1)
            registry = CollectorRegistry()
            registry.register(FleetCollector(url, None, "agenttest"))
            scraped = samples(generate_latest(registry).decode())
        finally:
            s_answers.set()
        _, err = submitter.communicate(timeout=60)
        assert submitter.returncode == 0, err
    finally:
        if submitter.poll() is None:
            submitter.kill()
            submitter.communicate()
    run = _latest()
    assert total(scraped, "agenttest_runs", status="running") == 1
    shown = total(scraped, "agenttest_run_cost", run=run.id)
    assert shown == pytest.approx(_cost(agents.counted("A")), abs=1e-9)
    assert 0 < shown < run.total_cost


def test_the_viewer_and_the_html_report_show_the_runs_cost(
    agents: UsageAgents, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = write_suite(tmp_path, agents)
    run = _run(config, cases)
    whole = _cost(agents.counted_all())
    assert run.total_cost == pytest.approx(whole, abs=1e-9)
    shown = f"${whole:.4f}"
    report = tmp_path / "report.html"
    assert main(["report", run.id, "--format", "html", "-o", str(report)]) == 0
    viewer = Viewer(["--port", "0"], environment(tmp_path / ".agenttest"), tmp_path)
    try:
        root = viewer.root()
        with chromium() as browser:
            page, _ = open_page(browser, report.as_uri())
            cards = _cards(page)
            assert cards["cost"] == shown, cards
            page, _ = open_page(browser, f"{root}/")
            head = page.locator("table.runs thead th").all_inner_texts()
            cells = page.locator("table.runs tbody tr").first.locator("td").all_inner_texts()
            assert dict(zip(head, cells, strict=True))["cost"] == shown
        listed = httpx.get(f"{root}/api/runs", timeout=10).json()
        facts = listed["groups"][0]["runs"][0]
        assert facts["id"] == run.id
        assert facts["cost"] == pytest.approx(whole, abs=1e-9)
    finally:
        viewer.stop()


def _cards(page: Any) -> dict[str, str]:
    labels = page.locator(".summary .card .label").all_inner_texts()
    values = page.locator(".summary .card .value").all_inner_texts()
    return dict(zip(labels, values, strict=True))


def _per_call(model: str) -> float:
    prompt, completion = PRICING[model]
    return (1_000 * prompt + 250 * completion) / 1e6


def test_the_dry_run_counts_calls_by_role_and_estimates_their_cost(
    agents: UsageAgents, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A: two turns, judges 1 + 2 votes + a final one; S: a simulated conversation of up
    to 4 turns (its simulator up to 3 calls) and a final judge; G1, generated (the dry
    run calls the generator): one turn. Each twice (--repeat 2); the reporter once."""
    config, cases = write_suite(tmp_path, agents)
    args = ["-i", str(cases), "-i", "agents:gen?count=1", "-n", "target", "--config", str(config)]
    capsys.readouterr()
    assert main([*args, "--dry-run", "--repeat", "2", "--reporter", "agents:reporter"]) == 0
    err = capsys.readouterr().err
    rows = {tuple(line.split()[:2]): line for line in err.splitlines() if line.startswith("  ")}
    assert "up to 14 calls" in rows[("target", "target")]
    assert f"~${14 * _per_call('target'):.4f}" in rows[("target", "target")]
    assert " 10 calls" in rows[("judge", "judge")]
    assert "up to" not in rows[("judge", "judge")]
    assert "up to 6 calls  no pricing set for sim" in rows[("simulator", "sim")]
    assert " 1 call   ~$" in rows[("reporter", "reporter")]
    generated = agents.counted(None)["generator"]
    assert f"1 call   ${generated.cost:.4f}, made" in rows[("generator", "(called)")]
    estimate = (
        14 * _per_call("target") + 10 * _per_call("judge") + _per_call("reporter") + generated.cost
    )
    assert f"Estimated cost: up to ~${estimate:.4f} (assuming 1,000 prompt" in err
    assert "No pricing set for sim: not estimated" in err
    assert agents.counted("A") == {} and agents.counted("S") == {}, "no case was played"

    # What a run of them makes stays within the counts.
    agents.reset()
    assert main(args) == 0
    made = agents.counted_all()
    assert made["target"].calls <= 7 and made["judge"].calls == 5
    assert made["simulator"].calls <= 3


def test_the_dry_run_without_pricing_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"id": "x", "input": "hi"}) + "\n", encoding="utf-8")
    config = tmp_path / "agenttest.yaml"
    config.write_text(
        json.dumps(
            {
                "agents": {
                    "bot": {"protocol": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
                }
            }
        ),
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["-i", str(cases), "-n", "bot", "--config", str(config), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "  target     bot" in err and " 1 call   no pricing set for bot" in err
    assert "Estimated cost: none (no agent it calls has pricing set)" in err
