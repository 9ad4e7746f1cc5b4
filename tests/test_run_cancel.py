"""`agenttest-submit cancel RUN` on the embedded default: a run played by another
process stops its turns in flight (none is recorded after the cancel) and ends every
unfinished conversation skipped with the reason; a run whose process is gone is ended
by `cancel` itself. On a fleet: test_run_cancel_fleet.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from fleet import WatchingAgent, expense_case, wait_until, write_cases, write_project
from sqlalchemy.exc import OperationalError

from agenttest_worker.store.sql import run_results, runs


def env_for(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env["AGENTTEST_HOME"] = str(tmp_path / ".agenttest")
    return env


def submit(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def records(env: dict[str, str], cwd: Path, run: str) -> dict[str, dict[str, object]]:
    done = submit(["report", run, "--format", "jsonl"], env, cwd)
    assert "Traceback" not in done.stderr, done.stderr
    return {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}


def test_cancel_stops_an_embedded_run_played_by_another_process(
    tmp_path: Path, demo_url: str
) -> None:
    env = env_for(tmp_path)
    release = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.turn == 2, release)  # every case's turn 2 in flight
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(4)])
        args = ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        runner = subprocess.Popen(
            [sys.executable, "-m", "agenttest_submit.cli", *args, "--format", "jsonl"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            wait_until(lambda: len(agent.seen()) >= 8, 30, "every case's turn 2 in flight")
            cancelled = submit(["cancel", "last", "--reason", "stop now"], env, tmp_path)
            assert cancelled.returncode == 0, cancelled.stderr
            assert "cancelled (stop now)" in cancelled.stderr
            assert "on this machine is running it" in cancelled.stderr
            out, err = runner.communicate(timeout=15)  # within seconds, turns still held
        finally:
            release.set()
            if runner.poll() is None:
                runner.kill()
                runner.communicate()
        assert runner.returncode == 0, err
        assert "Traceback" not in err
        shown = [json.loads(line) for line in out.splitlines()]
        assert {(r["id"], r["status"], r.get("skip_reason")) for r in shown} == {
            (f"C{i}", "skipped", "stop now") for i in range(4)
        }
        # Turn 1 of each is kept; the turns cut short were not recorded.
        assert all([t["turn"] for t in r["turns"]] == [1] for r in shown)
        stored = records(env, tmp_path, "last")
        assert all([t["turn"] for t in r["turns"]] == [1] for r in stored.values())  # type: ignore[attr-defined]
    status = submit(["status", "last"], env, tmp_path)
    assert "status    done (cancelled: stop now)" in status.stdout


def test_cancel_ends_an_embedded_run_whose_process_is_gone(tmp_path: Path, demo_url: str) -> None:
    env = env_for(tmp_path)
    release = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(lambda seen: seen.turn == 2, release)
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case(f"C{i}") for i in range(3)])
        runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agenttest_submit.cli",
                "-i",
                str(cases),
                "-n",
                "slow.expense",
                "--config",
                str(config),
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        wait_until(lambda: len(agent.seen()) >= 6, 30, "every case's turn 2 in flight")
        # Its turns are written every half second: turn 1 of each is stored by now.
        url = f"sqlite:///{tmp_path / '.agenttest' / 'agenttest.db'}"

        def first_turns_stored() -> bool:
            try:
                run = runs.latest_run(url)
            except OperationalError:  # the run's process has not made the schema yet
                return False
            return run is not None and run_results.count_played_turns(url, run.id) == 3

        wait_until(first_turns_stored, 10, "turn 1 of each case stored")
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
        release.set()
        done = submit(["cancel", "last"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "0 passed, 0 failed, 3 skipped" in done.stderr
    stored = records(env, tmp_path, "last")
    assert {r["status"] for r in stored.values()} == {"skipped"}
    assert all(str(r["skip_reason"]).startswith("cancelled by ") for r in stored.values())
    assert len(agent.seen()) == 6  # nothing was called again
