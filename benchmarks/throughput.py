"""Distributed throughput and CPU per turn against the floor the stack allows, in one run.

    python -m benchmarks.throughput --conversations 300 --turns 3 --concurrency 100 \
        --latency-ms 50 --workers 1

Both sides run N conversations of `--turns` turns against the same fixed-latency agent
(its own process, served over https with a self-signed certificate trusted through
SSL_CERT_FILE: benchmarks/common.py), through real Redis, Postgres and Celery worker
processes (same
concurrency; the floor on Celery's threads pool, agenttest on its own event-loop pool
unless `--agenttest-pool threads`):
- floor: a bare Celery chain, one httpx call and one Postgres insert per turn
  (benchmarks/floor_chain.py);
- agenttest: `agenttest-submit --no-wait` on a JSONL file of N cases with `--turns`
  static turns and a `contains` assertion each, workers `celery -A agenttest_worker`;
  timed from the submitter's start to the run's aggregation.
Prints turns/s for both (end to end, and steady: first to last turn saved), the ratios,
CPU per turn of the workers, Postgres (the backends serving the side's database), Redis
and the agent (what the machine's cores allow at that total, and about how many cores
the side kept busy), and the peak RSS of the worker(s) and submitter.

The targets (exit status 1 when one is missed): the workers' and Postgres's CPU per
turn at most `--target-cpu-ms` (5 ms; the median over `--rounds`, with the first
`--workers` count), and as many calls counted at the agent as agenttest's side played
turns (no call wasted, none doubled).

`--workers 1,2` measures both sides with one worker process each, then two, in the same
run, and prints how each side scaled. `--rounds N` measures everything N times, the
sides alternating, and prints each round's ratios and their medians. With 100 threads
per worker, one process already keeps most of a 2-core machine busy (its Python,
Postgres, Redis and the agent); with a few (`--concurrency 3`) neither side fills the
cores, which shows how worker processes scale where the cores allow it.
Needs Redis at 127.0.0.1:6379 and Postgres at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import redis

from benchmarks.common import (
    BIN,
    ROOT,
    AgentUrl,
    Targets,
    add_settings_option,
    compile_bytecode,
    fixed_agent,
    submit_command,
)

PG_ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def database() -> Iterator[str]:
    name = f"agenttest_bench_{os.getpid()}_{secrets.token_hex(2)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


CLAIM_SCRIPT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('FLUSHDB')
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""


@contextmanager
def redis_db() -> Iterator[str]:
    token = secrets.token_hex(4)
    for number in range(15, 0, -1):
        client = redis.Redis.from_url(f"{REDIS}/{number}")
        # tests/conftest.py's claim: taking the number and emptying it in one script, so
        # that nobody can take it between the two.
        if client.eval(CLAIM_SCRIPT, 1, "agenttest:db-owner", token, 3600):
            try:
                yield f"{REDIS}/{number}"
            finally:
                client.flushdb()
            return
    raise SystemExit("no free Redis database number")


def resident_kb(pid: int) -> int:
    """The process's resident memory now (VmRSS), in KB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0])


def _cpu_from_stat(text: str) -> float:
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_bytes(conn: psycopg.Connection[Any]) -> int:
    """Postgres's write-ahead log written so far (the whole cluster's), in bytes: what
    the statements in between stored."""
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()
    assert row is not None
    return int(row[0])


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used so far."""
    return _cpu_from_stat(Path(f"/proc/{pid}/stat").read_text())


def servers_cpu_seconds() -> tuple[float, float]:
    """CPU time used so far by the live Postgres and Redis server processes.

    Sampled before and after a side's run: the difference is what the servers did for
    it, as long as nothing else uses them meanwhile (backends that exited in between,
    such as the submitter's, are not counted).
    """
    postgres = redis_server = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(postgres)" in text:
            postgres += _cpu_from_stat(text)
        elif "(redis-server)" in text:
            redis_server += _cpu_from_stat(text)
    return postgres, redis_server


class BackendsCpu(threading.Thread):
    """CPU time of the Postgres backends serving one database, from start to `stop()`:
    its backends (pg_stat_activity) sampled every 0.2 s, each counted from its first
    sample (from zero if it started since), so that other databases' work on a shared
    server (other test runs) is left out. A backend that ends between two samples loses
    its last 0.2 s; the server's shared processes (WAL writer, checkpointer) are not
    counted."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.done = threading.Event()
        with psycopg.connect(url, autocommit=True) as conn:
            self._sample(conn, initial=True)
        self.start()

    def _sample(self, conn: psycopg.Connection[Any], initial: bool = False) -> None:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        for (pid,) in rows:
            try:
                cpu = process_cpu_seconds(pid)
            except OSError:
                continue  # it just ended
            self.first.setdefault(pid, cpu if initial else 0.0)
            self.last[pid] = cpu

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.done.wait(0.2):
                self._sample(conn)

    def stop(self) -> float:
        self.done.set()
        self.join()
        with psycopg.connect(self.url, autocommit=True) as conn:
            self._sample(conn)
        return sum(self.last[pid] - first for pid, first in self.first.items())


# Every worker started, so that each side stops its own whatever happened: one left
# running after a failed side would consume the next benchmark's messages (the Redis
# database number is reused) against a database already dropped.
_started: list[Worker] = []


@contextmanager
def stopping_workers() -> Iterator[None]:
    try:
        yield
    finally:
        for worker in _started:
            worker.stop()


class Worker:
    """A Celery worker process; peak memory read from its rusage when it exits."""

    def __init__(
        self,
        app: str,
        env: dict[str, str],
        concurrency: int,
        queue: str,
        log_path: Path,
        pool: str | None = "threads",
    ):
        _started.append(self)
        self.stopped = False
        self.log_path = log_path
        self.handle = log_path.open("w")
        self.proc = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                app,
                "worker",
                # None: the app's own pool (agenttest's is its event-loop pool).
                *(["--pool", pool] if pool else []),
                "--concurrency",
                str(concurrency),
                "-Q",
                queue,
                "--loglevel",
                "WARNING",
                "-n",
                f"{queue}-{secrets.token_hex(3)}@%h",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
        )
        self.peak_kb = 0
        self.cpu_at_ready = 0.0
        self.rss_kb_at_ready = 0

    def wait_ready(self, broker: str, queue: str, timeout: float = 60) -> None:
        # Ready when it consumes: a probe message it cannot run would be noise, so poll
        # the broker for the worker's registration via its consumer (BRPOP) instead.
        # Only this benchmark's database counts: a consumer of another (a worker left
        # over from another run) would make a worker that is still starting look ready.
        client = redis.Redis.from_url(broker)
        db = str(client.connection_pool.connection_kwargs.get("db", 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"worker exited: see {self.log_path}")
            clients = client.client_list()
            if any(c.get("cmd") == "brpop" and c.get("db") == db for c in clients):
                self.cpu_at_ready = process_cpu_seconds(self.proc.pid)
                self.rss_kb_at_ready = resident_kb(self.proc.pid)
                return
            time.sleep(0.2)
        raise SystemExit(f"worker not ready after {timeout}s: see {self.log_path}")

    def busy_cpu(self) -> float:
        """CPU seconds used since the worker was ready (its start-up excluded)."""
        return process_cpu_seconds(self.proc.pid) - self.cpu_at_ready

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, _, usage = os.wait4(self.proc.pid, 0)
        self.peak_kb = usage.ru_maxrss
        self.handle.close()


class Stall:
    """Stops the benchmark, loudly, when a side makes no progress for `seconds`."""

    def __init__(self, side: str, logs: list[Path], seconds: float = 60.0) -> None:
        self.side, self.logs, self.seconds = side, logs, seconds
        self.last, self.since = -1, time.monotonic()

    def check(self, done: int, total: int) -> None:
        if done != self.last:
            self.last, self.since = done, time.monotonic()
        elif time.monotonic() - self.since > self.seconds:
            tails = "\n".join(p.read_text(errors="replace")[-1500:] for p in self.logs)
            raise SystemExit(
                f"{self.side}: no progress for {self.seconds:g} s at {done} of {total} turns; "
                f"worker logs end with:\n{tails}"
            )


class Side(NamedTuple):
    # End to end: from the first publish (floor) or the submitter's start (agenttest)
    # until every turn is saved (and, for agenttest, the reports are stored).
    turns_per_second: float
    # Between the first and the last turn saved (the rows' timestamps): the rate once
    # conversations are flowing, without either side's fixed costs.
    steady_turns_per_second: float
    # CPU seconds per turn: the worker processes' (start-up excluded) and Postgres's.
    worker_cpu: float
    database_cpu: float
    broker_cpu: float
    agent_cpu: float
    # Calls counted at the agent during the side's run (agenttest's side only).
    agent_calls: int = 0

    @property
    def total_cpu(self) -> float:
        """CPU seconds per turn of every process the turn runs in."""
        return self.worker_cpu + self.database_cpu + self.broker_cpu + self.agent_cpu


UNMEASURED = Side(*(float("nan"),) * 6)

# Workers' and Postgres's CPU per turn that the users' workload affords (ms).
TARGET_CPU_MS = 5.0


class Measured(NamedTuple):
    """Both sides with one number of workers."""

    workers: int
    floor: Side
    ours: Side
    submitter_kb: int
    worker_kb: list[int]


def others_cpu_seconds(agent: AgentUrl) -> tuple[float, float]:
    """CPU time used so far by Redis (the whole server) and the agent."""
    return servers_cpu_seconds()[1], process_cpu_seconds(agent.pid)


def finish_side(
    workers: list[Worker],
    agent: AgentUrl,
    others_before: tuple[float, float],
    backends: BackendsCpu,
    turns: int,
    elapsed: float,
    steady_seconds: float,
) -> Side:
    """A side's figures, its CPU read before its workers are stopped (which this does).

    `steady_seconds` is the time from its first to its last turn saved."""
    cpu = sum(w.busy_cpu() for w in workers)
    database_cpu = backends.stop()
    broker_cpu, agent_cpu = (
        after - before
        for after, before in zip(others_cpu_seconds(agent), others_before, strict=True)
    )
    for w in workers:
        w.stop()
    return Side(
        turns / elapsed,
        (turns - 1) / steady_seconds,
        cpu / turns,
        database_cpu / turns,
        broker_cpu / turns,
        agent_cpu / turns,
    )


def run_floor(
    args: argparse.Namespace, workers_count: int, broker: str, db: str, agent: AgentUrl, tmp: Path
) -> Side:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE floor_turns (conversation text, turn int, output text, "
            "created_at timestamptz DEFAULT now(), PRIMARY KEY (conversation, turn))"
        )
    env = {
        **os.environ,
        "BENCH_BROKER": broker,
        "BENCH_DB": db,
        "BENCH_AGENT": agent,
        "PYTHONPATH": str(ROOT),
    }
    workers = [
        Worker("benchmarks.floor_chain", env, args.concurrency, "floor", tmp / f"floor-{i}.log")
        for i in range(workers_count)
    ]
    for w in workers:
        w.wait_ready(broker, "floor")
    os.environ.update({"BENCH_BROKER": broker})
    sys.path.insert(0, str(ROOT))
    from benchmarks.floor_chain import app, turn

    app.conf.broker_url = broker
    total = args.conversations * args.turns
    backends = BackendsCpu(db)
    others_before = others_cpu_seconds(agent)
    started = time.monotonic()
    with app.producer_or_acquire() as producer:
        for i in range(args.conversations):
            turn.apply_async((f"c{i}", 1, args.turns), producer=producer)
    with psycopg.connect(db, autocommit=True) as conn:
        watch = Stall("floor", [w.log_path for w in workers])
        while (done := conn.execute("SELECT count(*) FROM floor_turns").fetchone()[0]) < total:  # type: ignore[index]
            watch.check(done, total)
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        steady = conn.execute(
            "SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM floor_turns"
        ).fetchone()[0]  # type: ignore[index]
    return finish_side(workers, agent, others_before, backends, total, elapsed, float(steady))


def wait_for_run(
    conn: psycopg.Connection[Any],
    watch: Stall,
    total: int,
    tick: float,
    workers: Sequence[Worker] = (),
) -> None:
    """Until the newest run is done, `watch` checking that its turns go on; a worker of
    `workers` that exits meanwhile stops the benchmark at once."""
    while True:
        for worker in workers:
            if worker.proc.poll() is not None:
                raise SystemExit(f"{watch.side}: a worker died; see {worker.log_path}")
        row = conn.execute(
            "SELECT status, (SELECT count(*) FROM turns) FROM runs ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
        if row and row[0] == "done":
            return
        watch.check(row[1] if row else 0, total)
        time.sleep(tick)


def write_suite(
    tmp: Path, conversations: int, turns: int, agent: str, agent_timeout: float | None = None
) -> tuple[Path, Path]:
    """`conversations` cases of `turns` static turns, a `contains` assertion each, and the
    agenttest.yaml of the fixed agent at `agent` (its call timeout `agent_timeout` when
    given: a slow agent's calls outlast the default)."""
    cases = tmp / "cases.jsonl"
    with cases.open("w") as handle:
        for i in range(conversations):
            steps = [
                {
                    "input": f"message {t + 1}",
                    "assertions": [{"type": "contains", "value": "Noted"}],
                }
                for t in range(turns)
            ]
            # max_turns: past the default (20) a case would end failed, its turns unplayed.
            case = {"id": f"c{i}", "turns": steps, "max_turns": turns}
            handle.write(json.dumps(case) + "\n")
    config = tmp / "agenttest.yaml"
    timeout = f"    timeout: {agent_timeout:g}\n" if agent_timeout is not None else ""
    config.write_text(
        f"agents:\n  bench:\n    base_url: {agent}\n    model: bench\n    max_retries: 0\n"
        + timeout
    )
    return cases, config


def run_agenttest(
    args: argparse.Namespace, workers_count: int, broker: str, db: str, agent: AgentUrl, tmp: Path
) -> tuple[Side, int, list[int]]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
        "AGENTTEST_BROKER_URL": broker,
        "AGENTTEST_DATABASE_URL": db,
        "AGENTTEST_WORKER_CONCURRENCY": str(args.concurrency),
        **dict(args.env),
    }
    subprocess.run(
        [str(BIN / "agenttest-submit"), "db", "upgrade"], env=env, check=True, capture_output=True
    )
    workers = [
        Worker(
            "agenttest_worker",
            env,
            args.concurrency,
            "agenttest",
            tmp / f"agenttest-{i}.log",
            args.agenttest_pool,
        )
        for i in range(workers_count)
    ]
    for w in workers:
        w.wait_ready(broker, "agenttest")
    cases, config = write_suite(tmp, args.conversations, args.turns, agent)
    calls_before = agent.calls()
    backends = BackendsCpu(db)
    others_before = others_cpu_seconds(agent)
    started = time.monotonic()
    started_at = time.time()  # the database's clock is this machine's
    submitter = subprocess.Popen(
        submit_command(cases, config, "--no-wait"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status, usage = os.wait4(submitter.pid, 0)
    submitted = time.monotonic() - started
    submitter_kb = usage.ru_maxrss
    if status != 0:
        raise SystemExit(f"submitter failed: {submitter.stderr.read() if submitter.stderr else ''}")
    with psycopg.connect(db, autocommit=True) as conn:
        watch = Stall("agenttest", [w.log_path for w in workers])
        wait_for_run(conn, watch, args.conversations * args.turns, tick=0.05)
        turns = conn.execute("SELECT count(*) FROM turns").fetchone()[0]  # type: ignore[index]
        elapsed = time.monotonic() - started
        # Where the wall time went, from the rows' own timestamps (the database's clock).
        created, first_turn, last_turn, reports = conn.execute(
            "SELECT extract(epoch FROM r.created_at),"
            " extract(epoch FROM min(t.created_at) - r.created_at),"
            " extract(epoch FROM max(t.created_at) - r.created_at),"
            " extract(epoch FROM r.finished_at - r.created_at)"
            " FROM runs r JOIN turns t ON t.run_id = r.id GROUP BY r.id"
        ).fetchone()  # type: ignore[misc]
    log(
        f"agenttest phases: run created at {float(created) - started_at:.2f} s, submitter "
        f"exited at {submitted:.2f} s; from the run's creation: "
        f"first turn saved {first_turn:.2f} s, last turn {last_turn:.2f} s, "
        f"reports stored {reports:.2f} s; total {elapsed:.2f} s"
    )
    expected = args.conversations * args.turns
    if turns != expected:
        raise SystemExit(f"expected {expected} turn rows, found {turns}")
    side = finish_side(
        workers, agent, others_before, backends, turns, elapsed, float(last_turn - first_turn)
    )
    return (
        side._replace(agent_calls=agent.calls() - calls_before),
        submitter_kb,
        [w.peak_kb for w in workers],
    )


def measure(args: argparse.Namespace, workers_count: int, agent: AgentUrl, tmp: Path) -> Measured:
    floor = ours = UNMEASURED
    submitter_kb, worker_kb = 0, [0]
    if args.only != "agenttest":
        with redis_db() as broker, database() as db, stopping_workers():
            floor = run_floor(args, workers_count, broker, db, agent, tmp)
    if args.only != "floor":
        with redis_db() as broker, database() as db, stopping_workers():
            ours, submitter_kb, worker_kb = run_agenttest(
                args, workers_count, broker, db, agent, tmp
            )
    return Measured(workers_count, floor, ours, submitter_kb, worker_kb)


def report(args: argparse.Namespace, measured: Measured) -> None:
    floor, ours = measured.floor, measured.ours
    print(
        f"distributed throughput: {args.conversations} conversations x {args.turns} turns, "
        f"concurrency {args.concurrency} x {measured.workers} worker(s), "
        f"agent {args.latency_ms:g} ms"
        + (f", replies of {args.reply_chars} characters" if args.reply_chars else "")
    )
    print(f"  floor (bare Celery chain)   {floor.turns_per_second:8.1f} turns/s")
    print(f"  agenttest                   {ours.turns_per_second:8.1f} turns/s")
    print(f"  ratio                       {ours.turns_per_second / floor.turns_per_second:8.2f}")
    print(
        f"  steady rate (first to last turn saved): floor {floor.steady_turns_per_second:.1f}, "
        f"agenttest {ours.steady_turns_per_second:.1f} turns/s, ratio "
        f"{ours.steady_turns_per_second / floor.steady_turns_per_second:.2f}"
    )
    print(
        f"  worker CPU per turn: floor {floor.worker_cpu * 1000:.1f} ms, "
        f"agenttest {ours.worker_cpu * 1000:.1f} ms (user + system, start-up excluded)"
    )
    print(
        f"  Postgres CPU per turn: floor {floor.database_cpu * 1000:.2f} ms, "
        f"agenttest {ours.database_cpu * 1000:.2f} ms (the backends serving its database)"
    )
    print(
        f"  Redis CPU per turn: floor {floor.broker_cpu * 1000:.2f} ms, "
        f"agenttest {ours.broker_cpu * 1000:.2f} ms (the whole server: others' use counts)"
    )
    cores = os.cpu_count() or 1
    print(
        f"  all processes (workers, Postgres, Redis, agent) per turn: "
        f"floor {floor.total_cpu * 1000:.2f} ms, agenttest {ours.total_cpu * 1000:.2f} ms; "
        f"what {cores} cores allow at that: floor {cores / floor.total_cpu:.0f}, "
        f"agenttest {cores / ours.total_cpu:.0f} turns/s"
    )
    # How much of the machine the side kept busy: near the core count, adding worker
    # processes cannot scale it; well below, they can (nothing else is shared).
    print(
        f"  cores kept busy, about (steady rate x all processes' CPU per turn): "
        f"floor {floor.steady_turns_per_second * floor.total_cpu:.2f}, "
        f"agenttest {ours.steady_turns_per_second * ours.total_cpu:.2f} of {cores}"
    )
    print(
        f"  peak RSS: worker {max(measured.worker_kb) / 1024:.0f} MB, "
        f"submitter {measured.submitter_kb / 1024:.0f} MB"
    )


def report_scaling(runs: list[Measured]) -> None:
    """Each number of workers against the first, for both sides (same run, same agent)."""
    base = runs[0]
    for run in runs[1:]:
        print(
            f"scaling {base.workers} -> {run.workers} worker processes: "
            f"floor x{run.floor.turns_per_second / base.floor.turns_per_second:.2f}, "
            f"agenttest x{run.ours.turns_per_second / base.ours.turns_per_second:.2f} "
            f"(steady: floor "
            f"x{run.floor.steady_turns_per_second / base.floor.steady_turns_per_second:.2f}, "
            f"agenttest "
            f"x{run.ours.steady_turns_per_second / base.ours.steady_turns_per_second:.2f})"
        )


def report_rounds(rounds: list[list[Measured]]) -> None:
    """Each round's ratios, agenttest to the floor, and their medians, per worker count."""
    for index, first in enumerate(rounds[0]):
        sides = [(runs[index].floor, runs[index].ours) for runs in rounds]
        end_to_end = [ours.turns_per_second / floor.turns_per_second for floor, ours in sides]
        steady = [
            ours.steady_turns_per_second / floor.steady_turns_per_second for floor, ours in sides
        ]
        print(
            f"over {len(rounds)} rounds, {first.workers} worker(s): end to end "
            f"{', '.join(f'{r:.2f}' for r in end_to_end)} (median "
            f"{statistics.median(end_to_end):.2f}); steady "
            f"{', '.join(f'{r:.2f}' for r in steady)} (median {statistics.median(steady):.2f})"
        )


def worker_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("worker counts are positive integers: 1 or 1,2")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument(
        "--reply-chars", type=int, default=0, help="the agent's reply length (default: short)"
    )
    parser.add_argument(
        "--workers",
        type=worker_counts,
        default=[1],
        help="worker processes per side; several (1,2) measure each and print the scaling",
    )
    add_settings_option(parser)
    parser.add_argument(
        "--only", choices=("floor", "agenttest"), help="measure one side (for profiling)"
    )
    parser.add_argument(
        "--agenttest-pool",
        help="the agenttest workers' --pool (default: their own, the event-loop pool; "
        "threads to compare); the floor always runs Celery's threads pool",
    )
    parser.add_argument(
        "--target-cpu-ms",
        type=float,
        default=TARGET_CPU_MS,
        help="the most workers' + Postgres's CPU per turn allowed (ms)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure both sides this many times, alternating, and print each round's "
        "ratios and their medians (this machine's speed swings more than a change's effect)",
    )
    args = parser.parse_args()
    compile_bytecode()
    import tempfile

    rounds: list[list[Measured]] = []
    with (
        tempfile.TemporaryDirectory() as tmpdir,
        fixed_agent(args.latency_ms, args.reply_chars) as agent,
    ):
        for number in range(args.rounds):
            if args.rounds > 1:
                log(f"round {number + 1} of {args.rounds}")
            rounds.append([measure(args, count, agent, Path(tmpdir)) for count in args.workers])
    for runs in rounds:
        for run in runs:
            report(args, run)
        if len(runs) > 1:
            report_scaling(runs)
    if len(rounds) > 1:
        report_rounds(rounds)
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  (benchmark process peak {own_mb:.0f} MB)")
    if args.only is None:
        sys.exit(check_targets(args, [runs[0] for runs in rounds]))


def check_targets(args: argparse.Namespace, runs: list[Measured]) -> int:
    """The overhead target (workers' and Postgres's CPU per turn, the median of `runs`)
    and the calls target (every run), each beside the floor's figure."""
    targets = Targets()
    print(f"targets ({runs[0].workers} worker(s), agent over https):")
    ours = statistics.median((r.ours.worker_cpu + r.ours.database_cpu) * 1000 for r in runs)
    floor = statistics.median((r.floor.worker_cpu + r.floor.database_cpu) * 1000 for r in runs)
    targets.check(
        "worker + Postgres CPU per turn",
        f"{ours:.2f} ms ({ours / floor:.2f}x the floor)",
        f"{floor:.2f} ms, bare Celery chain",
        f"<= {args.target_cpu_ms:g} ms",
        ours <= args.target_cpu_ms,
    )
    turns = args.conversations * args.turns
    calls = [r.ours.agent_calls for r in runs]
    targets.check(
        "agent calls per played turn",
        f"{', '.join(f'{c / turns:.3f}' for c in calls)} ({', '.join(map(str, calls))} calls)",
        "1 call a turn",
        f"exactly {turns} calls a run",
        all(c == turns for c in calls),
    )
    return targets.exit_code()


if __name__ == "__main__":
    main()
