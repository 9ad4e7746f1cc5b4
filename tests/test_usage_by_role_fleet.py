"""Calls, tokens and cost by role on a fleet: two Celery workers over Redis and Postgres
play the suite of usage_kit.py, the generator called at submission and a --reporter
agent after the run; each record, the run's usage and `status RUN` (while the run goes
on, and after it) show what the agents counted. The embedded run is
tests/test_usage_by_role.py. The run's stored cost, without a budget, is checked here
too (tests/test_run_cost.py has the embedded one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on, free_port, run_id_of, wait_until
from test_metrics import added, samples, scrape
from test_metrics import total as metric_total
from usage_kit import UsageAgents, check_status, same_usage, status_rows, write_suite

from agenttest_worker.report.aggregation import build_report
from agenttest_worker.report.usage_tally import run_usage, usage_dict
from agenttest_worker.store.sql import runs, usage

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture
def agents() -> Iterator[UsageAgents]:
    with UsageAgents() as served:
        yield served


def _start(fleet: Fleet, **env: str) -> None:
    for name in ("a", "b"):
        fleet.start(name, concurrency=2, wait=False, **env)
    for worker in fleet.workers:
        worker.wait_ready()


def _status(fleet: Fleet, run_id: str) -> str:
    done = fleet.submit(["status", run_id], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_fleet_records_run_and_status_show_what_the_agents_counted(
    fleet: Fleet, agents: UsageAgents, tmp_path: Path
) -> None:
    _start(fleet)
    config, cases = write_suite(tmp_path, agents)
    out = tmp_path / "out.jsonl"
    args = ["-i", str(cases), "-i", "agents:gen?count=1", "-n", "target", "--config", str(config)]
    done = fleet.submit([*args, "-o", str(out), "--reporter", "agents:reporter"])
    assert done.returncode == 0, done.stderr + fleet.logs()[-4000:]
    run_id = run_id_of(done.stderr)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["A", "G1", "S"]
    for record in records:
        assert same_usage(record["usage_by_role"], agents.counted(record["id"])), record

    report = build_report(fleet.database_url, run_id)
    outside = agents.counted(None)
    assert set(outside) == {"generator", "reporter"}
    assert same_usage(usage_dict(report.run_usage), outside)
    total = run_usage(report.results, report.run_usage)
    assert same_usage(usage_dict(total), agents.counted_all())

    check_status(_status(fleet, run_id), agents.counted_all(), {"generator", "reporter"})
    # No budget: the run's total is its conversations' cost all the same, and its whole
    # cost (what `runs`, the viewer and the exporter show) adds the generator's and the
    # reporter's.
    stored = runs.get_run(fleet.database_url, run_id)
    assert stored is not None
    in_cases = sum(u.cost for case in ("A", "S", "G1") for u in agents.counted(case).values())
    assert stored.total_cost == pytest.approx(in_cases, abs=1e-9) and in_cases > 0
    whole = sum(u.cost for u in agents.counted_all().values())
    assert usage.run_cost(stored.total_cost, stored.usage) == pytest.approx(whole, abs=1e-9)


def test_fleet_status_shows_the_calls_of_a_run_still_running(
    fleet: Fleet, agents: UsageAgents, tmp_path: Path
) -> None:
    # S's target does not answer until A's calls have been seen: S's conversation is
    # certainly still going on when status is read. Its turn outlasts the fleet tests'
    # 5 s visibility timeout, which would give it to the other worker meanwhile (to run
    # alone, holding A's turns back behind it).
    _start(fleet, visibility_timeout="300")
    config, cases = write_suite(tmp_path, agents, timeout=120)
    s_answers = agents.hold("S")
    run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "target", "--config", str(config)])

    def a_recorded() -> str | None:
        text = _status(fleet, run_id)
        return text if ("judge", "judge") in status_rows(text) else None

    try:
        text = wait_until(a_recorded, 90, "A's calls to be recorded", step=0.2)
    finally:
        s_answers.set()
    assert "status    running" in text
    check_status(text, agents.counted("A"), set())
    fleet.wait_done(run_id)
    text = _status(fleet, run_id)
    assert "status    done" in text
    check_status(text, agents.counted_all(), set())


def test_fleet_counts_the_calls_of_a_turn_played_twice_once_in_the_run(
    fleet: Fleet, agents: UsageAgents, tmp_path: Path
) -> None:
    """A copy of A's first turn's message arrives while that turn waits on its target:
    both copies call the target and the judge, one records the turn, and the other's
    calls are the run's own (tests/test_unrecorded_usage.py), so that what the run
    reports is what the agents answered."""
    from agenttest_worker.fleet.celery_app import app
    from agenttest_worker.fleet.tasks import turn

    ports = [free_port(), free_port()]
    for name, port in zip(("a", "b"), ports, strict=True):
        fleet.start(
            name, concurrency=2, wait=False, visibility_timeout="300", metrics_port=str(port)
        )
    for worker in fleet.workers:
        worker.wait_ready()
    config, cases = write_suite(tmp_path, agents, timeout=60)
    a_answers = agents.hold("A")
    run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "target", "--config", str(config)])

    def a_asked(times: int) -> bool:
        bodies = agents.server.requests("target")
        return sum((b.get("metadata") or {}).get("test_id") == "A" for b in bodies) >= times

    try:
        wait_until(lambda: a_asked(1), 30, "A's first turn to reach its target")
        with app.connection_for_write(fleet.broker_url) as connection:
            turn.apply_async((run_id, "A", 1), connection=connection)
        wait_until(lambda: a_asked(2), 30, "the copy to reach the target too")
    finally:
        a_answers.set()
    fleet.wait_done(run_id)

    report = build_report(fleet.database_url, run_id)
    record = next(r for r in report.results if r.id == "A")
    played_twice = agents.counted("A")
    # The record holds one copy's calls; the run holds the other's first turn.
    assert record.usage_by_role is not None
    assert record.usage_by_role["target"].calls == played_twice["target"].calls - 1
    assert set(report.run_usage) == {"target", "judge"}
    assert report.run_usage["target"].calls == 1
    summed = run_usage(report.results, report.run_usage)
    assert same_usage(usage_dict(summed), agents.counted_all())
    rows = status_rows(_status(fleet, run_id))
    assert rows[("target", "(turns not recorded)")][0] == 1
    assert rows[("judge", "(turns not recorded)")][0] == 1
    # The workers' metrics count every call made, as the run does (not the turn twice).
    scraped = added(*(samples(scrape(port)) for port in ports))
    for role, used in agents.counted_all().items():
        assert metric_total(scraped, "agenttest_agent_calls_total", role=role) == used.calls, role
        tokens = metric_total(scraped, "agenttest_agent_tokens_total", role=role)
        assert tokens == used.total_tokens, role
        assert metric_total(scraped, "agenttest_agent_cost_total", role=role) == pytest.approx(
            used.cost
        )
    assert metric_total(scraped, "agenttest_turns_total") == sum(
        r.total_turns for r in report.results
    )
