"""What a turn costs as its conversation grows: turn ~3 against turn ~50, same run.

    python -m benchmarks.long_conversation --conversations 60 --turns 50 --reply-chars 1000

One Celery worker process (its default pool, the loop pool, unless `--pool`), Postgres
store, Redis broker, and the fixed agent (its own process: benchmarks/fixed_agent.py)
answering every turn after
`--latency-ms` with a reply of `--reply-chars` characters. `--conversations` cases of
`--turns` static turns (a `contains` assertion each) are submitted at once, so that
they start together and move in near lockstep (every turn waits the same latency).

How a turn's cost is read. While the run goes, the benchmark samples, every
`--sample-s` seconds: the worker's CPU, the CPU of every Postgres server process (the
benchmark's own backend left out) and of Redis, and, from the store, how many turn rows
exist of each turn number. Between two samples, the CPU used is charged to the turns
saved in between, evenly: a window of turn numbers (`--early 2-4`, `--late 46-49`)
gets the share of each interval's CPU that its turns are of the interval's turns, and
its cost per turn is that CPU over its turns. The conversations move in near lockstep,
so an interval's turns are of a few neighbouring numbers, and charging them evenly
mixes only neighbours' costs. (The counters tick in hundredths of a second: a window's
figure is a sum over many intervals, whose rounding mostly cancels out.) The first
turn (the conversation's start) and the last (which builds and stores the case's
record, once per conversation) are outside both windows by default; the last one is
printed on its own.

Each window's Postgres write-ahead log per turn (`WAL`) is printed beside: what a turn
stores, which the machine's other load does not move (the whole cluster's log: the
benchmark's database is alone on it while it runs).

The floor is the early window's cost in the same run: the target is the late window
within 1.25× of it (worker + Postgres CPU per turn). `--rounds N` repeats the run N
times (fresh database each time) and prints each, and the ratios' median.
The machine's other load moves both windows' figures (they are measured ~20 s apart):
read several rounds, and compare before/after in alternating rounds.
Needs Redis at 127.0.0.1:6379 and Postgres at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from benchmarks.common import BIN, AgentUrl, compile_bytecode, fixed_agent, submit_command
from benchmarks.throughput import (
    Stall,
    Worker,
    _cpu_from_stat,
    database,
    process_cpu_seconds,
    redis_db,
    stopping_workers,
    wal_bytes,
    write_suite,
)


@dataclass
class Sample:
    worker: float
    postgres: float
    redis: float
    agent: float
    # Turn rows saved so far, by turn number.
    saved: dict[int, int]
    # Postgres's write-ahead log written so far, in bytes: what the turns stored, a
    # figure the machine's other load does not move.
    wal: int = 0

    @property
    def count(self) -> int:
        return sum(self.saved.values())


def _servers_cpu(own_backend: int) -> tuple[float, float]:
    """CPU so far of the Postgres server processes (but `own_backend`) and Redis."""
    postgres = redis_server = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(postgres)" in text:
            if int(stat.parent.name) != own_backend:
                postgres += _cpu_from_stat(text)
        elif "(redis-server)" in text:
            redis_server += _cpu_from_stat(text)
    return postgres, redis_server


@dataclass
class Window:
    """The turns saved whose number is in [low, high], and their share of the CPU."""

    low: float
    high: float
    turns: int = 0
    worker: float = 0.0
    postgres: float = 0.0
    redis: float = 0.0
    agent: float = 0.0
    wal: float = 0.0

    def add(self, before: Sample, after: Sample) -> None:
        """Charge the window its share of the interval: the interval's CPU times the
        share of the turns saved in it whose number is in the window."""
        saved = after.count - before.count
        inside = sum(
            after.saved[t] - before.saved.get(t, 0)
            for t in after.saved
            if self.low <= t <= self.high
        )
        if saved <= 0 or inside <= 0:
            return
        share = inside / saved
        self.turns += inside
        self.worker += (after.worker - before.worker) * share
        self.postgres += (after.postgres - before.postgres) * share
        self.redis += (after.redis - before.redis) * share
        self.agent += (after.agent - before.agent) * share
        self.wal += (after.wal - before.wal) * share

    def per_turn(self, what: str) -> float:
        return float(getattr(self, what)) / self.turns if self.turns else float("nan")

    @property
    def cost(self) -> float:
        """Worker + Postgres CPU per turn: what the target is about."""
        return self.per_turn("worker") + self.per_turn("postgres")


@dataclass
class Round:
    early: Window
    late: Window
    last: Window
    samples: list[Sample] = field(default_factory=list)
    elapsed: float = 0.0
    # The worker's peak RSS and its RSS once ready, in MB: what its conversations held.
    worker_peak_mb: float = 0.0
    worker_ready_mb: float = 0.0


def span(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return float(low), float(high or low)


def run_round(args: argparse.Namespace, agent: AgentUrl, tmp: Path) -> Round:
    with redis_db() as broker, database() as db, stopping_workers():
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
            "AGENTTEST_BROKER_URL": broker,
            "AGENTTEST_DATABASE_URL": db,
            "AGENTTEST_WORKER_CONCURRENCY": str(args.concurrency),
            **dict(item.split("=", 1) for item in args.env),
        }
        subprocess.run(
            [str(BIN / "agenttest-submit"), "db", "upgrade"],
            env=env,
            check=True,
            capture_output=True,
        )
        worker = Worker(
            "agenttest_worker", env, args.concurrency, "agenttest", tmp / "worker.log", args.pool
        )
        worker.wait_ready(broker, "agenttest")
        cases, config = write_suite(tmp, args.conversations, args.turns, agent)
        total = args.conversations * args.turns
        with psycopg.connect(db, autocommit=True) as conn:
            own = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]

            def sample() -> Sample:
                rows = conn.execute("SELECT turn, count(*) FROM turns GROUP BY turn").fetchall()
                postgres, redis_cpu = _servers_cpu(own)
                return Sample(
                    worker.busy_cpu(),
                    postgres,
                    redis_cpu,
                    process_cpu_seconds(agent.pid),
                    {int(turn): int(count) for turn, count in rows},
                    wal_bytes(conn),
                )

            started = time.monotonic()
            submitter = subprocess.run(
                submit_command(cases, config, "--no-wait"), env=env, capture_output=True, text=True
            )
            if submitter.returncode != 0:
                raise SystemExit(f"submitter failed: {submitter.stderr[-2000:]}")
            samples = [sample()]
            watch = Stall("agenttest", [worker.log_path])
            while samples[-1].count < total:
                time.sleep(args.sample_s)
                samples.append(sample())
                watch.check(samples[-1].count, total)
            elapsed = time.monotonic() - started
        worker.stop()
    result = Round(Window(*args.early), Window(*args.late), Window(args.turns, args.turns))
    result.samples, result.elapsed = samples, elapsed
    result.worker_peak_mb = worker.peak_kb / 1024
    result.worker_ready_mb = worker.rss_kb_at_ready / 1024
    for before, after in itertools.pairwise(samples):
        for window in (result.early, result.late, result.last):
            window.add(before, after)
    return result


def report(args: argparse.Namespace, number: int, measured: Round) -> None:
    early, late, last = measured.early, measured.late, measured.last

    def name(w: Window) -> str:
        return f"turns {w.low:g}-{w.high:g}" if w.high != w.low else f"turn {w.low:g}"

    print(
        f"round {number}: {args.conversations} conversations x {args.turns} turns, replies "
        f"of {args.reply_chars} characters, agent {args.latency_ms:g} ms, concurrency "
        f"{args.concurrency}, one worker; {measured.elapsed:.1f} s"
    )
    for window in (early, late, last):
        print(
            f"  {name(window):<14} ({window.turns:>5} turns): worker "
            f"{window.per_turn('worker') * 1000:5.2f} ms + Postgres "
            f"{window.per_turn('postgres') * 1000:5.2f} ms = {window.cost * 1000:5.2f} ms per turn"
            f" (Redis {window.per_turn('redis') * 1000:.2f}, agent "
            f"{window.per_turn('agent') * 1000:.2f}; WAL {window.per_turn('wal') / 1024:.1f} KB)"
        )
    print(
        f"  ratio {name(late)} / {name(early)} (the floor): worker + Postgres "
        f"{late.cost / early.cost:.2f} (target <= 1.25); worker "
        f"{late.per_turn('worker') / early.per_turn('worker'):.2f}, Postgres "
        f"{late.per_turn('postgres') / early.per_turn('postgres'):.2f}"
    )
    print(
        f"  worker peak RSS {measured.worker_peak_mb:.0f} MB "
        f"({measured.worker_ready_mb:.0f} MB once ready)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=60)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--reply-chars", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--sample-s", type=float, default=0.1)
    parser.add_argument("--early", type=span, default=(2.0, 4.0), help="turns LOW-HIGH")
    parser.add_argument("--late", type=span, default=(46.0, 49.0), help="turns LOW-HIGH")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pool", help="the worker's --pool (default: its own; threads to compare)")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="AGENTTEST_X=VALUE",
        help="a setting for the worker and submitter (repeatable)",
    )
    args = parser.parse_args()
    if args.late[1] > args.turns:
        raise SystemExit("--late must end at or before --turns")
    compile_bytecode()
    with (
        tempfile.TemporaryDirectory() as tmpdir,
        fixed_agent(args.latency_ms, args.reply_chars) as agent,
    ):
        ratios = []
        for number in range(1, args.rounds + 1):
            measured = run_round(args, agent, Path(tmpdir))
            report(args, number, measured)
            ratios.append(measured.late.cost / measured.early.cost)
            sys.stdout.flush()
    if len(ratios) > 1:
        print(
            f"over {len(ratios)} rounds: {', '.join(f'{r:.2f}' for r in ratios)} "
            f"(median {statistics.median(ratios):.2f}; target <= 1.25)"
        )


if __name__ == "__main__":
    main()
