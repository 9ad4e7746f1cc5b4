"""`agenttest-submit cancel RUN` on a fleet (real workers, Redis, Postgres), and Ctrl-C
twice on a submitter watching a fleet run: the workers cut the run's turns in flight
(none recorded after the cancel), every unfinished conversation ends skipped with the
reason, and the run is reported. Embedded: test_run_cancel.py."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import (
    Fleet,
    WatchingAgent,
    expense_case,
    fleet_on,
    lines_read,
    turn_rows,
    wait_until,
    write_cases,
    write_project,
)
from sqlalchemy import select

from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def records(fleet: Fleet, run_id: str) -> list[dict[str, object]]:
    done = fleet.submit(["report", run_id, "--format", "jsonl"])
    assert "Traceback" not in done.stderr, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.fleet
def test_cancel_stops_a_fleet_run_and_cuts_its_turns_in_flight(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    release = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.turn == 2, release)
        config = write_project(tmp_path, agent.base_url)
        # Six cases, four at a time: two wait unstarted when the run is cancelled.
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(6)])
        fleet.start("w", concurrency=8)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config), "--parallel", "4"]
        )
        wait_until(lambda: len(agent.seen()) >= 8, 30, "four turns 2 in flight")
        done = fleet.submit(["cancel", run_id, "--reason", "stop now"])
        assert done.returncode == 0, done.stderr
        assert f"run {run_id}: cancelled (stop now)" in done.stderr
        fleet.wait_done(run_id, timeout=15)  # the held turns were cut, not waited for
        release.set()
        seen = len(agent.seen())
    shown = records(fleet, run_id)
    assert {(r["id"], r["status"], r.get("skip_reason")) for r in shown} == {
        (f"C{i}", "skipped", "stop now") for i in range(6)
    }
    # Turn 1 of the four started is kept; no turn 2 was recorded; the two never
    # started called nothing.
    assert sorted(turn_rows(fleet.database_url, run_id)) == [(f"C{i}", 1) for i in range(4)]
    assert seen == 8
    run = runs.get_run(fleet.database_url, run_id)
    assert run is not None and run.cancel_reason == "stop now"
    report = fleet.submit(["report", run_id])
    assert "stop now" in report.stdout


@pytest.mark.fleet
def test_ctrl_c_twice_on_a_watching_submitter_cancels_the_fleet_run(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    release = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.turn == 2, release)
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(3)])
        fleet.start("w", concurrency=4)
        watcher = fleet.submit_background(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        err, reader = lines_read(watcher.stderr)
        wait_until(lambda: len(agent.seen()) >= 6, 30, "every turn 2 in flight")
        watcher.send_signal(signal.SIGINT)
        wait_until(lambda: any("press Ctrl-C again" in line for line in err), 15, "the offer")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(15) == 130
        reader.join(5)
        text = "".join(err)
        run_id = text.split("cancel run ")[1].split()[0]
        assert f"run {run_id}: cancelled (cancelled by " in text and "(Ctrl-C twice)" in text
        fleet.wait_done(run_id, timeout=15)
        release.set()
    shown = records(fleet, run_id)
    assert {r["status"] for r in shown} == {"skipped"}
    assert all("Ctrl-C twice" in str(r["skip_reason"]) for r in shown)
    assert sorted(turn_rows(fleet.database_url, run_id)) == [(f"C{i}", 1) for i in range(3)]


@pytest.mark.fleet
def test_one_ctrl_c_leaves_the_fleet_run_going(fleet: Fleet, demo_url: str, tmp_path: Path) -> None:
    fleet.start("w", concurrency=4)
    with WatchingAgent(demo_url, delay=0.5) as agent:
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(2)])
        watcher = fleet.submit_background(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        err, reader = lines_read(watcher.stderr)
        wait_until(lambda: agent.seen(), 30, "a turn in flight")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(20) == 130
        reader.join(5)
        run_id = "".join(err).split("cancel run ")[1].split()[0]
        fleet.wait_done(run_id, timeout=30)
    run = runs.get_run(fleet.database_url, run_id)
    assert run is not None and not run.cancelled and run.passed == 2


@pytest.mark.fleet
def test_cancel_ends_conversations_parked_for_a_person(fleet: Fleet, tmp_path: Path) -> None:
    """Parked for a person's answer with nobody watching (--interactive --no-wait), a
    conversation would wait for ever: the cancel ends it skipped too."""
    from scripted_agent import ScriptedAgent
    from test_interactive import asker, case, terminal_session

    with ScriptedAgent() as agent:
        agent.script("asker", asker)
        config = tmp_path / "parked.yaml"
        config.write_text(
            "agents:\n  shop.assistant:\n"
            f"    base_url: {agent.base_url}\n    model: asker\n    max_retries: 0\n",
            encoding="utf-8",
        )
        cases = tmp_path / "parked.jsonl"
        cases.write_text(
            "".join(json.dumps(case(f"P{i}")) + "\n" for i in range(2)), encoding="utf-8"
        )
        fleet.start("w", concurrency=4)
        # At a terminal (else nobody could be asked and nothing parks), returning at once.
        args = ["-i", str(cases), "-n", "shop.assistant", "--config", str(config)]
        session = terminal_session(fleet, [*args, "--interactive", "--no-wait"], answers={})
        assert session.code == 0, session.text
        run_id = session.text.split("agenttest-submit status ")[1].split(";")[0].strip()

        def parked() -> bool:
            with session_scope(fleet.database_url) as session:
                phases = session.scalars(
                    select(CaseRow.phase).where(CaseRow.run_id == run_id)
                ).all()
            return list(phases) == ["awaiting_human"] * 2

        wait_until(parked, 30, "both conversations parked for a person")
        done = fleet.submit(["cancel", run_id, "--reason", "nobody will answer"])
        assert done.returncode == 0, done.stderr
        fleet.wait_done(run_id, timeout=20)
    shown = records(fleet, run_id)
    assert {(r["id"], r["status"], r.get("skip_reason")) for r in shown} == {
        (f"P{i}", "skipped", "nobody will answer") for i in range(2)
    }
