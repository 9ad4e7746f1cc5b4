"""Submitting a large run to the fleet: time and submitter peak memory, beside a floor.

    python -m benchmarks.enqueue --cases 100000

agenttest: `agenttest-submit -i cases.jsonl -n bench --no-wait` with a Redis broker and
Postgres, timed as a whole process (start-up, checking every case, storing the run,
publishing one `agenttest.start` task per 500 cases, which workers expand into turn
tasks), its peak RSS from the kernel's rusage. A large file's second half is checked
by a child process (agenttest_submit/split_check.py); the kernel's figure is the larger
of the two processes' peaks, so the RSS of the submitter and its children together,
sampled every 20 ms, is printed beside it ("both"). Checks that every case is stored
and every batch queued.

floor: the least any submitter must do with the same file, in one process: read each
line with json.loads, insert the rows into Postgres in batches of 500, and push one
message per case onto a Redis list through a pipeline.
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

from agenttest_worker.fleet.queues import queue_lists
from benchmarks.common import compile_bytecode, submit_command, timed
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
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cases = tmp / "cases.jsonl"
        write_cases(cases, args.cases)
        config = tmp / "agenttest.yaml"
        config.write_text("agents:\n  bench:\n    base_url: http://127.0.0.1:9/v1\n")

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
            client = redis.Redis.from_url(broker)
            queued = sum(client.llen(name) for name in queue_lists("agenttest"))
            with psycopg.connect(db) as conn:
                stored = conn.execute("SELECT count(*) FROM cases").fetchone()
        batches = -(-args.cases // 500)
        if queued != batches or stored is None or stored[0] != args.cases:
            raise SystemExit(
                f"expected {args.cases} cases stored and {batches} batches queued, "
                f"got {stored} and {queued}"
            )

    print(f"submission of {args.cases:,} single-turn cases (Redis broker, Postgres store)")
    print(
        f"  floor (json.loads, batched INSERT, pipelined LPUSH)  {floor_s:7.1f} s  "
        f"{floor_kb / 1024:5.0f} MB"
    )
    print(
        f"  agenttest-submit --no-wait                           {ours_s:7.1f} s  "
        f"{ours_kb / 1024:5.0f} MB  (both: {both_kb / 1024:.0f} MB)"
    )
    print(f"  ratio to the floor                                   {ours_s / floor_s:7.2f}")
    print(f"  cases per second                                     {args.cases / ours_s:7.0f}")


if __name__ == "__main__":
    main()
