"""A fleet run stored by a process the submitter forks first thing (early_store.py,
fleet_storing.py), and that process's own promises (store/store_process.py): it stops
the call it is told to, and dies with a parent killed outright.

The submitter's signals (a run removed on SIGTERM while it is stored, a run left half
stored by SIGKILL) are tested on this path too: test_submitter_signals.py runs
`python -m agenttest_submit.cli`, which forks the store's process as the console
script does."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import redis
from fault_kit import openai_agent, write_config
from fleet import greeting_case, wait_until, write_cases

from agenttest_worker.store.db import upgrade

# The console script's order (leaving.py): fork, then import and run the command line;
# then what this interpreter imported.
SUBMITTING = """
import json, sys
from agenttest_submit.early_store import fleet_store_process
work = fleet_store_process(sys.argv[1:])
from agenttest_submit.cli import main
code = main(sys.argv[1:], store_work=work)
print(json.dumps({"code": code, "forked": work is not None,
                  "psycopg": "psycopg" in sys.modules, "redis": "redis" in sys.modules,
                  "others": sorted({"sqlalchemy", "celery", "kombu"} & set(sys.modules))}))
"""


def _python(script: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`script` run by a fresh interpreter with `args` and `env` besides this one's."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _submit(args: list[str], env: dict[str, str]) -> tuple[dict[str, object], str]:
    done = _python(SUBMITTING, args, env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _stored(database_url: str, run_id: str) -> tuple[str, int, int]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, total_cases, (SELECT count(*) FROM cases WHERE run_id = %s)"
            " FROM runs WHERE id = %s",
            [run_id, run_id],
        ).fetchone()
    assert row is not None, f"no run {run_id}"
    return str(row[0]), int(row[1]), int(row[2])


def test_a_fleet_run_is_stored_by_a_forked_process_and_its_submitter_imports_no_driver(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """The run, its cases and its start batches are what the submitter's own process
    stores and publishes with AGENTTEST_STORE_PROCESS=never, but written by the forked
    process: the submitter never imports psycopg or redis-py."""
    upgrade(pg_database)
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    cases = write_cases(tmp_path, [greeting_case(f"F{i}") for i in range(7)])
    queue = f"storing-{secrets.token_hex(3)}"
    env = {
        "AGENTTEST_BROKER_URL": redis_db,
        "AGENTTEST_DATABASE_URL": pg_database,
        "AGENTTEST_QUEUE": queue,
        "AGENTTEST_ENQUEUE_BATCH": "3",
        "AGENTTEST_STORE_PROCESS": "auto",
    }
    args = ["-i", str(cases), "-n", "demo", "--config", str(config), "--no-wait"]
    broker = redis.Redis.from_url(redis_db)
    seen = []
    for choice in ("auto", "never"):
        outcome, stderr = _submit(args, {**env, "AGENTTEST_STORE_PROCESS": choice})
        run_id = stderr.split("run ", 1)[1].split(":", 1)[0]
        starts = [json.loads(m) for m in broker.lrange(f"{queue}:9", 0, -1)]
        broker.delete(f"{queue}:9")
        seen.append((outcome, _stored(pg_database, run_id), len(starts)))
        assert all(m["headers"]["task"] == "agenttest.start" for m in starts)
        assert all(m["headers"]["argsrepr"].startswith(f"('{run_id}'") for m in starts)
    (forked, forked_run, forked_starts), (here, here_run, here_starts) = seen
    assert forked == {
        "code": 0,
        "forked": True,
        "psycopg": False,
        "redis": False,
        "others": [],
    }
    assert here["forked"] is False and here["psycopg"] is True
    assert forked_run == here_run == ("running", 7, 7)
    assert forked_starts == here_starts == 3  # 7 cases, 3 a batch


def test_no_process_is_forked_for_what_stores_no_run(redis_db: str, tmp_path: Path) -> None:
    """A subcommand, a dry run, help, nothing: the words say no run follows."""
    env = {"AGENTTEST_BROKER_URL": redis_db}
    cases = write_cases(tmp_path, [greeting_case("N1")])
    script = (
        "import sys\n"
        "from agenttest_submit.early_store import fleet_store_process\n"
        "print(fleet_store_process(sys.argv[1:]) is None)\n"
    )
    for args in (["status", "last"], ["-i", str(cases), "--dry-run"], ["--help"], []):
        done = _python(script, args, env)
        assert done.stdout.strip() == "True", (args, done.stderr)


# A call that stops where it stands when told to, or when its parent dies.
STOPPING = """
import os, signal, sys, time
from agenttest_worker.store.store_child import StoreInterrupted, stopping_with_the_parent
from agenttest_worker.store.store_process import forked_store_process

def waiting(seconds):
    with stopping_with_the_parent():
        time.sleep(seconds)
    return "slept"

work = forked_store_process()
child = work.call(os.getpid)
print("CHILD", child, flush=True)
if sys.argv[1] == "interrupt":
    reply = work.submit(waiting, 30)
    time.sleep(0.5)
    started = time.monotonic()
    work.interrupt()
    try:
        reply.result()
    except StoreInterrupted:
        print("INTERRUPTED", time.monotonic() - started, flush=True)
    print("AGAIN", work.call(os.getpid) == child, flush=True)
    work.close()
    print("CLOSED", flush=True)
else:
    work.submit(waiting, 30)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # ended, not yet reaped by whoever adopted it


def test_a_forked_store_process_stops_the_call_it_is_told_to_and_goes_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STOPPING, "interrupt"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("INTERRUPTED "), done.stdout
    assert float(lines[1].split()[1]) < 2.0, "stopped where it stood, not after its 30 s"
    assert lines[2:] == ["AGAIN True", "CLOSED"]
    assert _gone(int(lines[0].split()[1]))
    assert "Traceback" not in done.stderr


def test_a_forked_store_process_dies_with_a_parent_killed_outright() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPING, "kill"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    child = int(process.stdout.readline().split()[1])
    assert process.wait(timeout=30) == -9
    started = time.monotonic()
    wait_until(lambda: _gone(child), 5.0, "the store's process gone with its parent", step=0.01)
    assert time.monotonic() - started < 1.0, "not left to finish its 30 s call"
