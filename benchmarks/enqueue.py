"""Submitting a large run to the fleet: time and submitter peak memory, beside a floor.

    python -m benchmarks.enqueue --cases 100000
    python -m benchmarks.enqueue --cases 1000000      # the target's size

agenttest: `agenttest-submit -i cases.jsonl -n bench --no-wait` with a Redis broker and
Postgres, against an agent at an https URL (never called: nothing runs the cases),
timed as a whole process (start-up, checking every case, storing the run, publishing
its tasks), its peak RSS from the kernel's rusage and, should the submitter start
children, the RSS of it and its children together, sampled every 20 ms ("with
children"). Checks, through plain SQL and Redis, that every case is stored and that
tasks are queued.

floor: the least any submitter must do with the same file, in one process: read each
line with json.loads, insert the rows into Postgres in batches of 500, and push one
message per case onto a Redis list through a pipeline.

The targets (exit status 1 when one is missed): under `--target-seconds` (120 s) for
1,000,000 cases, scaled by the number of cases (12 s for 100,000: start-up makes a
smaller run's target the harder one), and under `--target-mb` (300 MB, whatever the
size) with children.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import redis

from benchmarks.common import Targets, compile_bytecode, queued_messages, submit_command, timed
from benchmarks.throughput import database, redis_db

# How often the submitter's process tree is measured.
SAMPLE_SECONDS = 0.02

FLOOR = r"""
import json, sys, time, psycopg, redis
path, db, broker = sys.argv[1:4]
started = time.monotonic()
conn = psycopg.connect(db, autocommit=False)
conn.execute("CREATE TABLE floor_cases (id text PRIMARY KEY, body jsonb)")
r = redis.Redis.from_url(broker)
pipe = r.pipeline(transaction=False)
batch = []
with open(path) as handle:
    for line in handle:
        case = json.loads(line)
        batch.append((case["id"], line))
        pipe.lpush("floor", json.dumps({"task": "turn", "args": [case["id"], 1]}))
        if len(batch) == 500:
            conn.cursor().executemany("INSERT INTO floor_cases VALUES (%s, %s)", batch)
            conn.commit()
            pipe.execute()
            batch = []
if batch:
    conn.cursor().executemany("INSERT INTO floor_cases VALUES (%s, %s)", batch)
    conn.commit()
pipe.execute()
print(time.monotonic() - started)
"""


def write_cases(path: Path, count: int) -> None:
    with path.open("w") as handle:
        for i in range(count):
            case = {
                "id": f"c{i:06d}",
                "input": f"Hello, this is test message number {i}",
                "assertions": [{"type": "contains", "value": "Noted"}],
            }
            handle.write(json.dumps(case) + "\n")


def _tree_rss_kb(pid: int) -> int:
    """The RSS of a process and its descendants, summed (KB); 0 for what has ended."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                total += next(
                    (int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0
                )
            with open(f"/proc/{current}/task/{current}/children") as children:
                pending.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            continue
    return total


def timed_tree(command: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """(seconds, the kernel's peak RSS in KB, the sampled peak of the process tree's RSS
    summed in KB) of a whole process that must exit 0."""
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(SAMPLE_SECONDS):
                peak = max(peak, _tree_rss_kb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.monotonic() - started
        done.set()
        sampler.join()
        if (code := os.waitstatus_to_exitcode(status)) != 0:
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{command[0]} exited {code}: {tail}")
    return elapsed, usage.ru_maxrss, max(peak, usage.ru_maxrss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument(
        "--target-seconds", type=float, default=120.0, help="the time allowed a million cases"
    )
    parser.add_argument("--target-mb", type=float, default=300.0, help="the peak RSS allowed")
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cases = tmp / "cases.jsonl"
        write_cases(cases, args.cases)
        config = tmp / "agenttest.yaml"
        config.write_text("agents:\n  bench:\n    base_url: https://127.0.0.1:9/v1\n")

        with redis_db() as broker, database() as db:
            floor_s, floor_kb, _ = timed(
                [sys.executable, "-c", FLOOR, str(cases), db, broker], dict(os.environ)
            )

        with redis_db() as broker, database() as db:
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
                "AGENTTEST_BROKER_URL": broker,
                "AGENTTEST_DATABASE_URL": db,
            }
            command = submit_command(cases, config, "--no-wait")
            ours_s, ours_kb, both_kb = timed_tree(command, env)
            queued = queued_messages(redis.Redis.from_url(broker))
            with psycopg.connect(db) as conn:
                stored = conn.execute("SELECT count(*) FROM cases").fetchone()
        if queued == 0 or stored is None or stored[0] != args.cases:
            raise SystemExit(
                f"expected {args.cases} cases stored and tasks queued, got {stored} and {queued}"
            )

    print(f"submission of {args.cases:,} single-turn cases (Redis broker, Postgres store)")
    print(
        f"  floor (json.loads, batched INSERT, pipelined LPUSH)  {floor_s:7.1f} s  "
        f"{floor_kb / 1024:5.0f} MB"
    )
    print(
        f"  agenttest-submit --no-wait                           {ours_s:7.1f} s  "
        f"{ours_kb / 1024:5.0f} MB  (with children: {both_kb / 1024:.0f} MB; "
        f"{queued} messages queued)"
    )
    print(f"  ratio to the floor                                   {ours_s / floor_s:7.2f}")
    print(f"  cases per second                                     {args.cases / ours_s:7.0f}")
    targets = Targets()
    seconds = args.target_seconds * args.cases / 1_000_000
    targets.check(
        "submission time",
        f"{ours_s:.1f} s, {ours_s / floor_s:.2f}x the floor",
        f"{floor_s:.1f} s",
        f"< {seconds:g} s ({args.target_seconds:g} s a million cases)",
        ours_s < seconds,
    )
    targets.check(
        "submitter peak RSS",
        f"{both_kb / 1024:.0f} MB",
        f"{floor_kb / 1024:.0f} MB",
        f"< {args.target_mb:g} MB",
        both_kb / 1024 < args.target_mb,
    )
    sys.exit(targets.exit_code())


if __name__ == "__main__":
    main()
