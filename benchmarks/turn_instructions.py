"""Instructions per turn of one worker process, agenttest's or the floor's, counted by
valgrind's callgrind: a figure that other work on a shared machine does not move, where
the CPU time `throughput.py` reads swings by a fifth from one run to the next.

    python -m benchmarks.turn_instructions --side agenttest --conversations 100
    python -m benchmarks.turn_instructions --side floor --conversations 100
    python -m benchmarks.turn_instructions --side agenttest --by-thread

The side runs as in `throughput.py` (`--turns` static turns a conversation against the
https agent of benchmarks/common.py, one worker at `--concurrency`), its worker under
`valgrind --tool=callgrind` with counting off until the worker is ready, then on from
the first publish (the floor's first turns; agenttest's submitter) until the last turn
is saved (agenttest: and the run's reports stored). Prints the instructions counted in
user space over the turns played, by shared object (`--by-thread`: by thread, too).
Kernel time (system calls, the loopback's TCP) is not counted. Under callgrind the worker
runs ~50x slower: whatever it does by the clock (the sweeper, Celery's timers) counts
more than in a real run, and the figure moves by a few percent from run to run.
By thread, in agenttest's loop pool, in the order the pool starts them: 01 Celery's
consumer (kombu receiving each message, recording it unacknowledged, acknowledging it),
02 and 03 the store threads (the statements, publishing the next turn), 04 the event
loop (the turns, aiohttp, TLS: libcrypto), the last busy one a task thread (start
batches publishing first turns, the run's aggregation).

Needs valgrind, Redis at 127.0.0.1:6379 and Postgres at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from benchmarks.common import BIN, ROOT, fixed_agent, submit_command
from benchmarks.throughput import database, redis_db, write_suite


def start_worker(
    app: str, env: dict[str, str], args: argparse.Namespace, out: Path
) -> subprocess.Popen[bytes]:
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    valgrind += [f"--callgrind-out-file={out}/callgrind.%p"]
    if args.by_thread:
        valgrind.append("--separate-threads=yes")
    queue = "floor" if args.side == "floor" else "agenttest"
    worker = [str(BIN / "python"), "-m", "celery", "-A", app, "worker"]
    worker += ["--pool", "threads"] if args.side == "floor" else []
    worker += ["--concurrency", str(args.concurrency), "-Q", queue, "--loglevel", "WARNING"]
    worker += ["-n", f"{queue}-callgrind@%h", "--without-mingle", "--without-gossip"]
    log = (out / "worker.log").open("w")
    return subprocess.Popen(valgrind + worker, cwd=ROOT, env=env, stdout=log, stderr=log)


def wait_ready(worker: subprocess.Popen[bytes], broker: str, out: Path) -> None:
    """Until the worker waits on its queue (its BRPOP, on this benchmark's database)."""
    client = redis.Redis.from_url(broker)
    db = str(client.connection_pool.connection_kwargs.get("db", 0))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"worker exited: see {out / 'worker.log'}")
        if any(c.get("cmd") == "brpop" and c.get("db") == db for c in client.client_list()):
            return
        time.sleep(0.5)
    raise SystemExit("worker not ready after 600 s")


def counting(worker: subprocess.Popen[bytes], on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(worker.pid)],
        check=True,
        capture_output=True,
    )


def run_floor(
    args: argparse.Namespace, broker: str, db: str, agent: str, out: Path
) -> subprocess.Popen[bytes]:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE floor_turns (conversation text, turn int, output text, "
            "created_at timestamptz DEFAULT now(), PRIMARY KEY (conversation, turn))"
        )
    env = {**os.environ, "BENCH_BROKER": broker, "BENCH_DB": db, "BENCH_AGENT": agent}
    env["PYTHONPATH"] = str(ROOT)
    worker = start_worker("benchmarks.floor_chain", env, args, out)
    wait_ready(worker, broker, out)
    os.environ["BENCH_BROKER"] = broker
    from benchmarks.floor_chain import app, turn

    app.conf.broker_url = broker
    counting(worker, True)
    with app.producer_or_acquire() as producer:
        for i in range(args.conversations):
            turn.apply_async((f"c{i}", 1, args.turns), producer=producer)
    total = args.conversations * args.turns
    with psycopg.connect(db, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM floor_turns").fetchone()[0] < total:  # type: ignore[index]
            time.sleep(0.5)
    return worker


def run_agenttest(
    args: argparse.Namespace, broker: str, db: str, agent: str, out: Path
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env.update(
        AGENTTEST_BROKER_URL=broker,
        AGENTTEST_DATABASE_URL=db,
        AGENTTEST_WORKER_CONCURRENCY=str(args.concurrency),
    )
    upgrade = [str(BIN / "agenttest-submit"), "db", "upgrade"]
    subprocess.run(upgrade, env=env, check=True, capture_output=True)
    worker = start_worker("agenttest_worker", env, args, out)
    wait_ready(worker, broker, out)
    cases, config = write_suite(out, args.conversations, args.turns, agent)
    counting(worker, True)
    submit = submit_command(cases, config, "--no-wait")
    subprocess.run(submit, env=env, check=True, capture_output=True)
    with psycopg.connect(db, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT status FROM runs ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
            if row and row[0] == "done":
                break
            time.sleep(0.5)
    return worker


def self_cost_by_object(path: Path) -> collections.Counter[str]:
    """Instructions counted in each shared object's own code (callgrind's self cost)."""
    names: dict[str, str] = {}
    cost: collections.Counter[str] = collections.Counter()
    current = "?"
    skip_call_line = False
    for line in path.read_text().splitlines():
        if line.startswith(("ob=", "cob=")):
            match = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line)
            if match:
                if match.group(2) is not None:
                    names[match.group(1)] = match.group(2)
                if line.startswith("ob="):
                    current = names.get(match.group(1), "?")
        elif line.startswith("calls="):
            skip_call_line = True  # the next line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip_call_line:
                skip_call_line = False
                continue
            fields = line.split()
            if len(fields) >= 2:
                cost[current.rsplit("/", 1)[-1]] += int(fields[1])
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("agenttest", "floor"), default="agenttest")
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--by-thread", action="store_true", help="also count each thread")
    args = parser.parse_args()
    turns = args.conversations * args.turns
    with (
        tempfile.TemporaryDirectory() as tmpdir,
        fixed_agent(args.latency_ms) as agent,
        redis_db() as broker,
        database() as db,
    ):
        out = Path(tmpdir)
        run = run_floor if args.side == "floor" else run_agenttest
        worker = run(args, broker, db, agent, out)
        counting(worker, False)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=600)
        files = sorted(out.glob(f"callgrind.{worker.pid}*"))
        by_object: collections.Counter[str] = collections.Counter()
        for path in files:
            thread = self_cost_by_object(path)
            if args.by_thread and sum(thread.values()) >= turns * 1000:
                top = ", ".join(name for name, _ in thread.most_common(3))
                print(
                    f"  thread {path.name.rsplit('-', 1)[-1]}: "
                    f"{sum(thread.values()) / turns / 1e6:.3f} M a turn ({top})"
                )
            by_object.update(thread)
    total = sum(by_object.values())
    print(f"{args.side}: {total / turns / 1e6:.3f} M instructions a turn ({turns} turns)")
    for name, count in by_object.most_common(12):
        print(f"  {100 * count / total:5.1f}%  {count / turns / 1e3:7.0f} K  {name}")


if __name__ == "__main__":
    sys.exit(main())
