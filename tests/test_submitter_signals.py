"""SIGTERM (a cancelled CI job, `timeout`, a stopped container) stops `agenttest-submit` as
Ctrl-C does, through the same cleanup, instead of killing it where it stands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from fault_kit import openai_agent, write_config
from fleet import (
    Fleet,
    WatchingAgent,
    case_rows,
    expense_case,
    fleet_on,
    greeting_case,
    lines_read,
    run_id_of,
    turn_rows,
    wait_until,
    write_cases,
)

from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import recovery, runs
from agenttest_worker.store.sql import run_results as results


def _run_ids(database_url: str) -> set[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM runs")}


def _new_runs(database_url: str, known: set[str], where: str = "TRUE") -> list[tuple[str, int]]:
    """(run id, cases stored) of the runs not in `known` (the database is shared by the
    session's tests)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT runs.id, (SELECT count(*) FROM cases WHERE cases.run_id = runs.id)"
            f" FROM runs WHERE NOT (runs.id = ANY(%s)) AND {where}",
            [list(known)],
        ).fetchall()
    return [(str(run_id), int(count)) for run_id, count in rows]


def _cases_of(database_url: str, run_id: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM cases WHERE run_id = %s", [run_id]).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.fleet
def test_sigterm_while_a_run_is_stored_removes_it(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Terminated half-way through storing a large run, the submitter removes the run
    (what Ctrl-C does), exits 143 and prints no traceback, instead of leaving a run
    that stays `pending` for ever with some of its cases."""
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    cases = tmp_path / "many.jsonl"
    with cases.open("w") as handle:
        for i in range(60_000):
            handle.write(json.dumps(greeting_case(f"T{i}")) + "\n")
    with contextmanager(fleet_on)(redis_db, pg_database, demo_url, tmp_path) as fleet:
        known = _run_ids(pg_database)
        process = fleet.submit_background(
            ["-i", str(cases), "-n", "demo", "--config", str(config), "--no-wait"]
        )
        run_id, _ = wait_until(
            lambda: next((r for r in _new_runs(pg_database, known) if r[1] > 0), None),
            60.0,
            "the first cases stored",
            step=0.02,
        )
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 143, stderr
        assert "terminated" in stderr and "Traceback" not in stderr
        assert _new_runs(pg_database, known) == [], "the run was removed"
        assert _cases_of(pg_database, run_id) == 0


@pytest.mark.fleet
def test_sigterm_while_waiting_leaves_the_run_to_the_workers(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    cases = write_cases(tmp_path, [greeting_case(f"W{i}") for i in range(3)])
    with contextmanager(fleet_on)(redis_db, pg_database, demo_url, tmp_path) as fleet:
        known = _run_ids(pg_database)
        process = fleet.submit_background(["-i", str(cases), "-n", "demo", "--config", str(config)])
        # Once it says the run is enqueued, it is watching: the run shows as running a
        # moment earlier, while the submitter still stores it (a SIGTERM then removes it).
        said, reader = lines_read(process.stderr)
        wait_until(lambda: "case(s) enqueued" in "".join(said), 60.0, "the run enqueued")
        assert _new_runs(pg_database, known, "status = 'running'")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        reader.join(timeout=10)
        stderr = "".join(said)
        assert process.returncode == 143, stderr
        assert "terminated: stopped watching" in stderr and "Traceback" not in stderr
        run_id = run_id_of(stderr)

        fleet.start("after", concurrency=2)  # the run was left to the fleet
        fleet.wait_done(run_id)
    assert [status for _, _, status in case_rows(pg_database, run_id)] == ["passed"] * 3


@pytest.mark.parametrize(
    ("stop", "code", "word"),
    [("sigterm", 143, "terminated"), ("ctrl-c", 130, "interrupted")],
)
def test_sigterm_mid_run_on_the_embedded_default_keeps_every_turn_played(
    demo_url: str, tmp_path: Path, stop: str, code: int, word: str
) -> None:
    """An embedded run keeps its conversations in memory and writes them every half
    second; terminated, it writes what it has first, so `resume` plays only the turns
    that had not been played (killed outright, the last half second is played again).
    Ctrl-C at a terminal reaches the whole process group: the run's last write goes
    through all the same."""
    parallel, total = 4, 20
    with WatchingAgent(demo_url, delay=0.015) as agent:

        def turns_seen(since: int = 0) -> set[tuple[str | None, int]]:
            return {(seen.case, seen.turn) for seen in agent.seen()[since:]}

        config = write_config(tmp_path, {"demo": openai_agent(agent.base_url)})
        cases = write_cases(tmp_path, [expense_case(f"E{i}") for i in range(total)])
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "agenttest_submit.cli"]
        options = ["-n", "demo", "--config", str(config), "--parallel", str(parallel)]
        process = subprocess.Popen(
            [*command, "-i", str(cases), *options],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # a process group of its own, as a terminal's job
        )
        try:
            wait_until(lambda: len(turns_seen()) >= 30, 60.0, "30 turns started", step=0.01)
            if stop == "sigterm":
                process.send_signal(signal.SIGTERM)
            else:
                os.killpg(process.pid, signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        started = turns_seen()
        assert process.returncode == code, stderr
        assert word in stderr and "Traceback" not in stderr

        url = get_settings().effective_database_url()
        run = runs.latest_run(url)
        assert run is not None
        recorded = set(turn_rows(url, run.id))
        # `status` counts every turn played so far, not only those of finished cases
        # (which are all of them when SIGTERM fell between conversations in every lane).
        assert results.count_played_turns(url, run.id) == len(recorded) >= run.total_turns
        # Each lane had at most one turn in flight; every other one is recorded.
        assert len(recorded) >= len(started) - parallel, (len(recorded), len(started), stderr)

        before_resume = len(agent.seen())
        resumed = subprocess.run(
            [*command, "resume", run.id, "--parallel", str(parallel)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert resumed.returncode == 0, resumed.stderr
        replayed = turns_seen(before_resume) & recorded
    assert not replayed, f"turns recorded before SIGTERM were played again: {sorted(replayed)}"
    rows = turn_rows(url, run.id)
    assert len(rows) == total * 3 and set(rows.values()) == {1}, "every turn recorded once"
    assert [status for _, _, status in case_rows(url, run.id)] == ["passed"] * total


def _half_stored_run(fleet: Fleet, database_url: str, config: Path, tmp_path: Path) -> str:
    """A run whose submitter was SIGKILLed while storing it: its id (run `pending`)."""
    cases = tmp_path / "many.jsonl"
    with cases.open("w") as handle:
        for i in range(60_000):
            handle.write(json.dumps(greeting_case(f"K{i}")) + "\n")
    known = _run_ids(database_url)
    process = fleet.submit_background(
        ["-i", str(cases), "-n", "demo", "--config", str(config), "--no-wait"],
        enqueue_batch="40",
    )
    run_id, _ = wait_until(
        lambda: next((r for r in _new_runs(database_url, known) if r[1] > 0), None),
        60.0,
        "the first cases stored",
        step=0.01,
    )
    process.kill()
    process.communicate(timeout=30)
    run = runs.get_run(database_url, run_id)
    assert run is not None and run.status == "pending"
    assert 0 < _cases_of(database_url, run_id) < 60_000
    return str(run_id)


def _assert_closed_as_abandoned(database_url: str, run_id: str) -> None:
    stored = _cases_of(database_url, run_id)
    run = runs.get_run(database_url, run_id)
    assert run is not None and run.status == "done" and run.cancelled
    assert run.total_cases == stored
    assert f"after {stored} case(s)" in (run.cancel_reason or "")
    statuses = [s for _, _, s in case_rows(database_url, run_id)]
    assert len(statuses) == stored and set(statuses) <= {"passed", "skipped"}
    report = results.get_report(database_url, run_id, "jsonl")
    assert report is not None
    records = [json.loads(line) for line in report.splitlines() if line.strip()]
    skipped = [r for r in records if r.get("status") == "skipped"]
    assert len(skipped) == statuses.count("skipped") and len(records) == stored
    # (Which stored cases had been started before the kill is up to timing: those that
    # had not end skipped with the reason, those that had may have passed.)
    assert all("submitter stopped" in (r.get("skip_reason") or "") for r in skipped), skipped[:2]


@pytest.mark.fleet
def test_a_run_left_half_stored_by_a_killed_submitter_is_closed_by_the_sweeper(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """SIGKILL (or the out-of-memory killer) gives the submitter no chance to clean up: its
    run stays `pending` with part of its cases, some started. Once nothing of it has
    moved for the stall period, a worker's sweeper starts it with the cases it has,
    cancelled with the reason; what had not run ends skipped, and the run gets its
    reports."""
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    with contextmanager(fleet_on)(redis_db, pg_database, demo_url, tmp_path) as fleet:
        run_id = _half_stored_run(fleet, pg_database, config, tmp_path)
        # Not yet: the submitter might still be storing it.
        assert recovery.close_abandoned_runs(pg_database, 3600, run_id) == []

        fleet.start("sweeping", concurrency=8, stall_seconds="2")
        fleet.wait_done(run_id, timeout=90)
        status = fleet.submit(["status", run_id])
        logs = fleet.logs()
    _assert_closed_as_abandoned(pg_database, run_id)
    assert "its submitter stopped while storing the run" in status.stdout + status.stderr
    assert f"run {run_id}: closed" in logs


@pytest.mark.fleet
def test_resume_closes_a_half_stored_run_once_nothing_moved_for_the_stall_period(
    any_broker: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    with contextmanager(fleet_on)(any_broker, pg_database, demo_url, tmp_path) as fleet:
        run_id = _half_stored_run(fleet, pg_database, config, tmp_path)
        early = fleet.submit(["resume", run_id], stall_seconds="600")
        assert early.returncode == 0, early.stderr
        assert "is still being stored" in early.stderr
        run = runs.get_run(pg_database, run_id)
        assert run is not None and run.status == "pending"

        time.sleep(1.2)
        later = fleet.submit(["resume", run_id], stall_seconds="1")
        assert later.returncode == 0, later.stderr
        assert f"run {run_id}: closed, its submitter stopped" in later.stderr
        fleet.start("finishing", concurrency=8)
        fleet.wait_done(run_id, timeout=90)
    _assert_closed_as_abandoned(pg_database, run_id)
