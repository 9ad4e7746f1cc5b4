"""Prometheus metrics: two workers and the fleet exporter, scraped over HTTP, add up to
what the run stored.

A known run (agents that answer, that answer 429 once, that always answer 429, that time
out) plays on two threads-pool workers, each serving its metrics on a port of its own;
both scrapes together must count the run's turns by status, its calls by outcome, its
retries, tokens and cost, and the exporter (`agenttest-submit metrics`) must show the
run's progress and the broker's queues while it runs, and forget the run once it is
done. A prefork worker adds its processes up (multiprocess mode). The dashboard names
only metrics that exist, and a worker without AGENTTEST_METRICS_PORT opens nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fleet import Fleet, fleet_on, free_port, wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from scripted_agent import Body, Reply, ScriptedAgent, fail, say

from agenttest_submit.commands.metrics_exporter import FleetCollector
from agenttest_worker.observe.metrics import WorkerMetrics
from agenttest_worker.store.sql import run_history as history
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "agenttest.json"
# What every successful scripted reply reports, and what agent `ok` charges per million.
PROMPT, COMPLETION = 10, 5
PRICE = {"prompt_per_million": 1000.0, "completion_per_million": 2000.0}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text: str = response.read().decode()
        return text


def samples(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(found: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(
        value
        for (sample, sample_labels), value in found.items()
        if sample == name and labels.items() <= dict(sample_labels).items()
    )


def added(*scrapes: Samples) -> Samples:
    summed: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    for found in scrapes:
        for key, value in found.items():
            if not key[0].endswith("_created"):
                summed[key] += value
    return dict(summed)


def type_names(text: str) -> set[str]:
    """The metrics a scrape declares (`# TYPE` lines), with the samples' suffixes."""
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        if kind == "histogram":
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:  # (a counter's TYPE line names its samples: ..._total)
            names.add(name)
    return names


class FirstRefused:
    """A rule that answers each conversation's first request with a 429, then OK."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, body: Body) -> Reply:
        case = str(body["messages"][-1]["content"]).split("#")[-1]
        if case not in self.seen:
            self.seen.add(case)
            return fail(429, "slow down", headers={"Retry-After": "0"})
        return say("Hello again")


def _project(tmp_path: Path, agent: ScriptedAgent) -> Path:
    entries = {
        # Spread over both workers: each answer takes a moment.
        "ok": agent.entry(
            "ok", max_retries=1, pricing=PRICE, rate_limit={"requests_per_second": 1000}
        ),
        "flaky": agent.entry("flaky", max_retries=1),
        "busy": agent.entry("busy", max_retries=1),
        "slow": agent.entry("slow", max_retries=0, timeout=0.5),
        "last": agent.entry("last", max_retries=0, timeout=30),
    }
    agent.script("ok", lambda body: say("Hello there", delay=0.5))
    agent.script("flaky", FirstRefused())
    agent.script("busy", lambda body: fail(429, "busy", headers={"Retry-After": "0"}))
    agent.script("slow", lambda body: say("Hello, eventually", delay=2))
    # The run's last conversation, kept going long enough to watch the run from outside.
    agent.script("last", lambda body: say("Hello at last", delay=4))
    path = tmp_path / "agenttest.yaml"
    path.write_text(json.dumps({"agents": entries}), encoding="utf-8")
    return path


def _cases(tmp_path: Path) -> Path:
    def case(case_id: str, agent: str, turns: int = 1) -> dict[str, Any]:
        steps = [
            {"input": f"Hi {n} #{case_id}", "assertions": [{"type": "contains", "value": "Hello"}]}
            for n in range(turns)
        ]
        return {"id": case_id, "agent": agent, "turns": steps}

    cases = [case(f"ok{n}", "ok") for n in range(6)]
    cases += [case("ok-long", "ok", turns=3)]
    cases += [case(f"flaky{n}", "flaky") for n in range(3)]
    cases += [case(f"busy{n}", "busy") for n in range(2)]
    cases += [case("slow0", "slow"), case("last0", "last")]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def _outcome(call: dict[str, Any]) -> str:
    """What the test expects a stored call's outcome to be, from its stored fields."""
    if call.get("error") is None:
        return "ok"
    if call.get("status_code") == 429:
        return "429"
    assert str(call["error"]).startswith("timeout"), call
    return "timeout"


def _role(call: dict[str, Any]) -> str:
    return "judge" if call["role"] == "validator" else str(call["role"])


@pytest.mark.fleet
def test_two_workers_and_the_exporter_count_what_the_run_stored(
    fleet: Fleet, tmp_path: Path
) -> None:
    with ScriptedAgent() as agent:
        config = _project(tmp_path, agent)
        cases = _cases(tmp_path)
        run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "ok", "--config", str(config)])

        exporter_port = free_port()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "agenttest_submit.cli", "metrics", "--port", str(exporter_port)],
            env=fleet.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: _answers(exporter_port), 20, "the exporter to serve")
            # No worker yet: the run's one start message waits, at the new-conversation
            # priority (fleet/celery_app.py), and nothing of the run has ended.
            queued = samples(scrape(exporter_port))
            lists = redis.Redis.from_url(fleet.broker_url)
            assert total(queued, "agenttest_queue_messages", queue="agenttest") == 1
            assert lists.llen("agenttest:9") == 1 and lists.llen("agenttest") == 0
            assert total(queued, "agenttest_run_cases", run=run_id) == 14
            assert total(queued, "agenttest_run_cases_finished", run=run_id) == 0
            assert total(queued, "agenttest_exporter_up", source="store") == 1
            assert total(queued, "agenttest_exporter_up", source="broker") == 1

            # Both started at once, so that both take a share of the run.
            ports = [free_port(), free_port()]
            started = [
                fleet.start(name, concurrency=2, wait=False, metrics_port=str(port))
                for name, port in zip(("m1", "m2"), ports, strict=True)
            ]
            for worker in started:
                worker.wait_ready()

            # While the last conversation plays, the exporter shows the run as stored:
            # a scrape, and the run read just after it, both with 13 cases finished (on
            # a busy machine the store may move between the two; then it is asked again).
            def nearly_done() -> Any:
                scraped = samples(scrape(exporter_port))
                run = runs.get_run(fleet.database_url, run_id)
                if run is None or run.status != "running" or run.finished_cases != 13:
                    return None
                finished = total(scraped, "agenttest_run_cases_finished", run=run_id)
                return (scraped, run) if finished == 13 else None

            going, run = wait_until(nearly_done, 60, "all but the last conversation to end")
            for status in ("passed", "failed", "skipped"):
                assert total(
                    going, "agenttest_run_cases_finished", run=run_id, status=status
                ) == getattr(run, status)
            assert total(going, "agenttest_run_cases_finished", run=run_id) == 13
            assert total(going, "agenttest_run_tokens", run=run_id) == run.total_tokens
            assert total(going, "agenttest_run_info", run=run_id, status="running") == 1
            # Every running run of the store (an earlier fleet test may have left one).
            stored = history.suite_runs(fleet.database_url, None)
            running = sum(r.status == "running" for r in stored)
            assert total(going, "agenttest_runs", status="running") == running >= 1
            exporter_text = scrape(exporter_port)

            fleet.wait_done(run_id, timeout=60)
            # Done: the run's series are gone; the queues are empty.
            after = samples(scrape(exporter_port))
            assert total(after, "agenttest_run_cases", run=run_id) == 0
            assert not [key for key in after if ("run", run_id) in key[1]]
            assert total(after, "agenttest_queue_messages") == 0
        finally:
            exporter.terminate()
            exporter.wait(10)

        worker_texts = [scrape(port) for port in ports]
    scraped = [samples(text) for text in worker_texts]
    both = added(*scraped)
    # Both workers played turns: the sums below are over two processes' counts.
    for found in scraped:
        assert total(found, "agenttest_turns_total") > 0

    records = [r.model_dump(mode="json") for r in results.iter_results(fleet.database_url, run_id)]
    assert len(records) == 14
    turns = Counter((r["agent"], t["status"]) for r in records for t in r["turns"])
    assert sum(turns.values()) == 16
    for (agent_name, status), count in turns.items():
        assert total(both, "agenttest_turns_total", agent=agent_name, status=status) == count
    assert total(both, "agenttest_turns_total") == 16
    assert total(both, "agenttest_turn_seconds_count") == 16
    ended = Counter((r["agent"], r["status"]) for r in records)
    for (agent_name, status), count in ended.items():
        assert (
            total(both, "agenttest_conversations_finished_total", agent=agent_name, status=status)
            == count
        )

    calls = [c for r in records for t in r["turns"] for c in t["calls"] or []]
    by_outcome = Counter((c["agent"], _role(c), _outcome(c)) for c in calls)
    # The script, independently: 9 answers from ok, 3 from flaky after a 429 each, two
    # calls refused twice by busy, one timeout, and the last conversation's answer.
    assert by_outcome == {
        ("ok", "target", "ok"): 9,
        ("flaky", "target", "ok"): 3,
        ("busy", "target", "429"): 2,
        ("slow", "target", "timeout"): 1,
        ("last", "target", "ok"): 1,
    }
    for (agent_name, role, outcome), count in by_outcome.items():
        assert (
            total(both, "agenttest_agent_calls_total", agent=agent_name, role=role, outcome=outcome)
            == count
        )
    assert total(both, "agenttest_agent_calls_total") == len(calls)
    assert total(both, "agenttest_agent_call_seconds_count") == len(calls)
    # Each flaky and busy call was tried twice: one retry each, for a 429.
    assert total(both, "agenttest_agent_retries_total", reason="429") == 5
    assert total(both, "agenttest_agent_retries_total") == sum(c["attempts"] - 1 for c in calls)
    assert total(both, "agenttest_agent_retries_total", agent="flaky") == 3
    # Tokens and cost as stored, and as the script says.
    stored_prompt = sum(c["usage"]["prompt_tokens"] for c in calls if c.get("usage"))
    stored_completion = sum(c["usage"]["completion_tokens"] for c in calls if c.get("usage"))
    assert (
        total(both, "agenttest_agent_tokens_total", kind="prompt") == stored_prompt == 13 * PROMPT
    )
    assert total(both, "agenttest_agent_tokens_total", kind="completion") == stored_completion
    cost = sum(r["usage_by_role"]["target"]["cost"] for r in records if r.get("usage_by_role"))
    assert total(both, "agenttest_agent_cost_total", agent="ok") == pytest.approx(cost)
    assert cost == pytest.approx(9 * (PROMPT * 1000 + COMPLETION * 2000) / 1e6)
    # Every attempt at ok waited for its rate-limit slot (none had to wait long).
    assert total(both, "agenttest_rate_limit_wait_seconds_count", agent="ok") == 9
    assert total(both, "agenttest_conversations_in_flight") == 0
    assert total(both, "agenttest_redeliveries_total") == 0
    # No run, case or session id in any worker label.
    for found in scraped:
        for _name, labels in found:
            for _label, value in labels:
                assert run_id not in value and "#" not in value

    # The dashboard's queries name metrics the scrapes declare.
    declared = set().union(*(type_names(t) for t in [*worker_texts, exporter_text]))
    assert _dashboard_metrics() <= declared


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return False
    return True


@pytest.mark.fleet
def test_a_prefork_worker_adds_its_processes_up(fleet: Fleet, tmp_path: Path) -> None:
    """--pool processes (Celery's name for prefork that the configured threads pool does
    not override): turns run in two child processes, and the main process's scrape adds
    up both processes' files."""
    with ScriptedAgent() as agent:
        agent.script("ok", lambda body: say("Hello", delay=0.3))
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": {"ok": agent.entry("ok")}}), encoding="utf-8")
        cases = tmp_path / "cases.jsonl"
        lines = [
            {"id": f"c{n}", "input": f"Hi #{n}", "assertions": [{"type": "contains", "value": "H"}]}
            for n in range(8)
        ]
        cases.write_text("".join(json.dumps(c) + "\n" for c in lines), encoding="utf-8")
        port = free_port()
        worker = fleet.start(
            "pre", concurrency=2, args=["--pool", "processes"], metrics_port=str(port)
        )
        run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "ok", "--config", str(config)])
        fleet.wait_done(run_id)
        found = samples(scrape(port))
    assert "prefork" in worker.log()
    assert total(found, "agenttest_turns_total", agent="ok", status="passed") == 8
    assert total(found, "agenttest_agent_calls_total", outcome="ok") == 8
    assert total(found, "agenttest_agent_tokens_total", kind="prompt") == 8 * PROMPT
    assert total(found, "agenttest_conversations_in_flight") == 0


@pytest.mark.fleet
def test_metrics_are_off_unless_a_port_is_set(fleet: Fleet, tmp_path: Path) -> None:
    """A worker without AGENTTEST_METRICS_PORT opens no port and never imports
    prometheus_client; the submitter's and the worker's imports do not either."""
    worker = fleet.start("plain")
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    assert f"pid={worker.pid}," not in listening
    code = (
        "import sys, agenttest_worker.fleet.tasks, agenttest_worker.fleet.sweeper, "
        "agenttest_submit.cli.main; sys.exit('prometheus_client' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], env=fleet.env).returncode == 0


def _dashboard_metrics() -> set[str]:
    """Every metric name in the dashboard's panel queries."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    names: set[str] = set()

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    found = list(panels(dashboard["panels"]))
    assert found, "a dashboard without panels"
    for panel in found:
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets") or []
        assert targets, f"panel {panel.get('title')!r} has no query"
        for target in targets:
            metrics = set(re.findall(r"\bagenttest_[a-z0-9_]+\b", target["expr"]))
            assert metrics, f"panel {panel.get('title')!r}: {target['expr']!r} names no metric"
            names |= metrics
    for variable in dashboard.get("templating", {}).get("list", []):
        names |= set(re.findall(r"\bagenttest_[a-z0-9_]+\b", str(variable.get("query", ""))))
    return names


def test_the_dashboard_names_only_metrics_that_exist(pg_database: str, redis_db: str) -> None:
    """Valid JSON whose every panel queries metrics a worker or the exporter declares."""
    from prometheus_client import generate_latest

    from agenttest_worker.store.sql.db import upgrade

    upgrade(pg_database)  # the exporter reads the runs table
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    registry.register(FleetCollector(pg_database, redis_db, "agenttest"))
    declared = type_names(generate_latest(registry).decode())
    assert "agenttest_run_cases" in declared and "agenttest_agent_calls_total" in declared
    used = _dashboard_metrics()
    assert used <= declared, f"not a metric: {sorted(used - declared)}"
    # The dashboard shows each subject the README promises.
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    titles = " ".join(p.get("title", "").lower() for p in dashboard["panels"])
    for subject in ("throughput", "latency", "retries", "progress", "queue", "tokens", "cost"):
        assert subject in titles, subject
