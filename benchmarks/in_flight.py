"""Turns one worker process keeps in flight against a slow agent, and at what cost.

    python -m benchmarks.in_flight --in-flight 2000 --latency-s 8 --turns 6
    python -m benchmarks.in_flight --in-flight 10000 --latency-s 40 --turns 3 \
        --target-share 0 --target-rss-mb 700

One Celery worker process (`celery -A agenttest_worker worker -c N`, its default pool
unless `--pool`), real Redis and Postgres, the fixed agent of benchmarks/fixed_agent.py
served over https (a self-signed certificate trusted through SSL_CERT_FILE:
benchmarks/common.py).
Three runs, the first two each with a worker of its own:
- the floor: the worker's own CPU-bound rate, N conversations of 3 turns against a
  50 ms agent (turns wait so little that the worker's CPU is what bounds them);
- the memory floor: a bare aiohttp process (one session, no connection limit) sending
  N Chat Completions requests at once to the slow agent: the least memory any runner
  holding N agent calls open in one Python process needs;
- the slow agent: N conversations of `--turns` turns against an agent answering after
  `--latency-s` seconds, so that N turns are in flight at once when the worker keeps up.
The ideal rate against the slow agent is min(N / latency, the floor's rate); the
benchmark prints the rate reached (in the window from one latency after the first turn
was saved to one latency before the last, from the rows' own timestamps, by Little's
law: see `rate_within`; a run too short for that, with few turns each: the whole run,
from one latency before its first turn was saved), its share of the ideal, the turns in flight
that rate implies (Little's law: rate × the time a turn takes), the worker's CPU per
turn, and its peak RSS, with the memory per turn in flight beside the memory floor's per
request (each the peak less the process's RSS before its first call: the worker's once
ready, the floor's with aiohttp imported and its session open; the worker's divided by
the most turns it had under way at once, from the turns' rows: a worker whose CPU
cannot start N turns within one latency never holds N), and its RSS once it has idled
3 s after the run ended (what it keeps after a burst). `--skip-floor` runs
only the slow agent. It fails loudly if a turn is lost or recorded twice, or the worker
dies.

The targets (exit status 1 when one is missed): the rate reached at least
`--target-share` (0.85) of the ideal, the worker's peak RSS under `--target-rss-mb`
(400 MB), and as many calls counted at the agent as turns played (none wasted).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from benchmarks.common import (
    BIN,
    Targets,
    add_settings_option,
    compile_bytecode,
    fixed_agent,
    submit_command,
)
from benchmarks.throughput import (
    Stall,
    Worker,
    database,
    log,
    redis_db,
    resident_kb,
    stopping_workers,
    wait_for_run,
    write_suite,
)

# How long the worker idles after its run before its RSS is read again.
SETTLE_SECONDS = 3.0


class Rate(NamedTuple):
    turns: int
    # Turns saved per second over the run's middle (see the module docstring).
    steady: float
    # Seconds a turn took from its request to its row, at the median (turn_ms is the
    # agent's part; the rest is the worker's).
    turn_seconds: float
    worker_cpu_per_turn: float
    worker_peak_mb: float
    worker_ready_mb: float
    # The most turns under way at once (from the turns' rows).
    most_in_flight: int
    # Where `steady` was measured: "the middle of the run", or "the whole run" (short).
    span: str = "the middle of the run"
    # The worker's RSS SETTLE_SECONDS after its run ended (aggregated), idle.
    worker_settled_mb: float = 0.0
    # Calls counted at the agent.
    agent_calls: int = 0


def play(args: argparse.Namespace, latency_s: float, turns: int, tmp: Path, label: str) -> Rate:
    conversations = args.in_flight
    with (
        fixed_agent(latency_s * 1000) as agent,
        redis_db() as broker,
        database() as db,
        stopping_workers(),
    ):
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
            "AGENTTEST_BROKER_URL": broker,
            "AGENTTEST_DATABASE_URL": db,
            "AGENTTEST_WORKER_CONCURRENCY": str(args.in_flight),
            # Turns wait `latency_s`: longer than that before a message is given back.
            "AGENTTEST_VISIBILITY_TIMEOUT": str(int(max(3600, latency_s * 10))),
            "AGENTTEST_STALL_SECONDS": str(int(max(600, latency_s * 10))),
            **dict(args.env),
        }
        subprocess.run(
            [str(BIN / "agenttest-submit"), "db", "upgrade"],
            env=env,
            check=True,
            capture_output=True,
        )
        worker = Worker(
            "agenttest_worker", env, args.in_flight, "agenttest", tmp / f"{label}.log", args.pool
        )
        worker.wait_ready(broker, "agenttest")
        # A folder per run: the floor's and the slow agent's suites differ.
        (tmp / label).mkdir()
        # A call waits `latency_s` seconds: keep the agent's time limit out of the way.
        cases, config = write_suite(tmp / label, conversations, turns, agent, agent_timeout=600)
        log(f"{label}: {conversations} conversations x {turns} turns, agent {latency_s:g} s")
        calls_before = agent.calls()
        submitted = subprocess.run(
            submit_command(cases, config, "--no-wait", "--timeout", "1h"),
            env=env,
            capture_output=True,
            text=True,
        )
        if submitted.returncode != 0:
            raise SystemExit(f"submitter failed: {submitted.stderr}")
        total = conversations * turns
        with psycopg.connect(db, autocommit=True) as conn:
            watch = Stall(label, [worker.log_path], seconds=max(60.0, latency_s * 3))
            wait_for_run(conn, watch, total, tick=0.5, workers=[worker])
            cpu = worker.busy_cpu()
            counts = conn.execute(
                "SELECT count(*), count(DISTINCT (case_id, turn)) FROM turns"
            ).fetchone()
            assert counts is not None
            if counts[0] != total or counts[1] != total:
                raise SystemExit(
                    f"{label}: {counts[0]} turn rows, {counts[1]} distinct, of {total}"
                )
            first, last = conn.execute(
                "SELECT extract(epoch FROM min(created_at)), extract(epoch FROM max(created_at))"
                " FROM turns"
            ).fetchone()  # type: ignore[misc]
            low, high = float(first) + latency_s, float(last) - latency_s
            span = "the middle of the run"
            if high - low < latency_s:
                # A short run (few turns each): its whole span, from when its first turns
                # were sent (one latency before the first was saved), so that the first
                # latency's wait counts; from the first save on, a 2-turn run of N
                # conversations looked up to twice as fast as N / latency allows.
                low, high = float(first) - latency_s, float(last)
                span = "the whole run"
            median_ms = conn.execute(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) FROM turns"
            ).fetchone()[0]  # type: ignore[index]
            spans = conn.execute(
                "SELECT extract(epoch FROM created_at) - duration_ms / 1000.0,"
                " extract(epoch FROM created_at) FROM turns"
            ).fetchall()
        # What the worker keeps once the burst is over: what it gives back to the system
        # shows here, not in its peak.
        time.sleep(SETTLE_SECONDS)
        settled_kb = resident_kb(worker.proc.pid)
        worker.stop()
        calls = agent.calls() - calls_before
    steady = rate_within(spans, low, high)
    return Rate(
        total,
        steady,
        float(median_ms or 0) / 1000,
        cpu / total,
        worker.peak_kb / 1024,
        worker.rss_kb_at_ready / 1024,
        most_at_once(spans),
        span,
        settled_kb / 1024,
        calls,
    )


def rate_within(spans: list[tuple[Any, Any]], low: float, high: float) -> float:
    """Turns per second between `low` and `high`, by Little's law: the turns' time under
    way inside the window (each turn's span clipped to it) over the window's length is
    how many were in flight on average; divided by the mean time a turn takes, the rate.

    Counting the rows saved inside the window instead misreads a run whose
    conversations move in step: against a 20 s agent every wave of 3,000 turns is saved
    within a few seconds, and a window whose ends fall between waves counted 175 turns/s
    where 3,000 in flight allow 150. Here each turn counts for the share of its span in
    the window, wherever its end falls."""
    spans_f = [(float(start), float(end)) for start, end in spans]
    mean = sum(end - start for start, end in spans_f) / len(spans_f)
    inside = sum(max(0.0, min(end, high) - max(start, low)) for start, end in spans_f)
    if mean <= 0:
        # Turns recorded as taking no time: count the ones that ended in the window.
        return sum(1 for _, end in spans_f if low <= end <= high) / (high - low)
    return inside / mean / (high - low)


def most_at_once(spans: list[tuple[Any, Any]]) -> int:
    """The most turns under way at one moment, from each turn's (start, end): its row's
    time less its duration, and its row's time."""
    # (time, change) in order: at the same time an end (-1) comes before a start (+1).
    events = sorted(
        [(float(start), 1) for start, _ in spans] + [(float(end), -1) for _, end in spans]
    )
    held = most = 0
    for _, change in events:
        held += change
        most = max(most, held)
    return most


MEMORY_FLOOR = r"""
import asyncio, resource, sys, aiohttp
url, count = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)

def resident_kb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])

async def main():
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        before = resident_kb()
        async def one(i):
            body = {"model": "bench", "messages": [{"role": "user", "content": f"message {i}"}]}
            async with session.post(url + "/chat/completions", json=body) as response:
                data = await response.json()
                return "Noted" in data["choices"][0]["message"]["content"]
        replies = await asyncio.gather(*(one(i) for i in range(count)))
        assert all(replies), "a reply without the expected text"
        print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

asyncio.run(main())
"""


class MemoryFloor(NamedTuple):
    before_mb: float
    peak_mb: float


def memory_floor(requests: int, latency_s: float) -> MemoryFloor:
    """Peak RSS of a bare aiohttp process holding `requests` calls to the slow agent."""
    with fixed_agent(latency_s * 1000) as agent:
        done = subprocess.run(
            [sys.executable, "-c", MEMORY_FLOOR, agent, str(requests)],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise SystemExit(f"memory floor failed: {done.stderr[-2000:]}")
    before_kb, peak_kb = (int(field) for field in done.stdout.split())
    return MemoryFloor(before_kb / 1024, peak_kb / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, default=2000, help="the worker's -c")
    parser.add_argument("--latency-s", type=float, default=8.0, help="the slow agent's latency")
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation")
    parser.add_argument("--pool", help="the worker's --pool (default: its own)")
    add_settings_option(parser)
    parser.add_argument(
        "--skip-floor", action="store_true", help="only the slow agent (no ratio printed)"
    )
    parser.add_argument(
        "--target-share",
        type=float,
        default=0.85,
        help="the least share of the ideal rate the slow agent's run must reach",
    )
    parser.add_argument(
        "--target-rss-mb", type=float, default=400.0, help="the worker's peak RSS allowed (MB)"
    )
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        floor = None if args.skip_floor else play(args, 0.05, 3, tmp, "floor")
        held = None if args.skip_floor else memory_floor(args.in_flight, args.latency_s)
        slow = play(args, args.latency_s, args.turns, tmp, "slow")
    n, latency = args.in_flight, args.latency_s
    print(
        f"in flight: one worker process, -c {n}"
        + (f", --pool {args.pool}" if args.pool else ", its default pool")
    )
    if floor is not None:
        print(
            f"  floor: CPU-bound rate with a 50 ms agent: {floor.steady:.1f} turns/s "
            f"({floor.turns} turns; worker CPU {floor.worker_cpu_per_turn * 1000:.2f} ms per "
            f"turn; peak RSS {floor.worker_peak_mb:.0f} MB)"
        )
    print(
        f"  slow agent ({latency:g} s): {slow.steady:.1f} turns/s over {slow.span} "
        f"({slow.turns} turns); a turn took {slow.turn_seconds:.2f} s at the median; "
        f"in flight about {slow.steady * max(slow.turn_seconds, latency):.0f} of {n}"
    )
    ideal = n / latency if floor is None else min(n / latency, floor.steady)
    print(
        f"  ideal min({n}/{latency:g} s"
        + (f", {floor.steady:.1f}" if floor is not None else "")
        + f") = {ideal:.1f} turns/s; reached {slow.steady / ideal:.2f} of it"
    )
    per_turn_kb = (slow.worker_peak_mb - slow.worker_ready_mb) * 1024 / slow.most_in_flight
    print(
        f"  worker CPU per turn {slow.worker_cpu_per_turn * 1000:.2f} ms; "
        f"peak RSS {slow.worker_peak_mb:.0f} MB ({slow.worker_ready_mb:.0f} MB once ready; "
        f"at most {slow.most_in_flight} turns in flight at once: ~{per_turn_kb:.1f} KB more "
        f"per turn); {slow.worker_settled_mb:.0f} MB {SETTLE_SECONDS:g} s after the run ended"
    )
    if held is not None:
        per_request_kb = (held.peak_mb - held.before_mb) * 1024 / n
        print(
            f"  memory floor (bare aiohttp, {n} requests at once): peak RSS "
            f"{held.peak_mb:.0f} MB ({held.before_mb:.0f} MB before: ~{per_request_kb:.1f} KB "
            f"per request); agenttest's per turn in flight {per_turn_kb / per_request_kb:.1f}x"
        )
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  (benchmark process peak {own_mb:.0f} MB)")
    targets = Targets()
    targets.check(
        "share of the ideal rate",
        f"{slow.steady:.1f} turns/s, {slow.steady / ideal:.2f} of {ideal:.1f}",
        f"N / latency {n / latency:.1f} turns/s, the worker's CPU-bound rate "
        + (f"{floor.steady:.1f}" if floor is not None else "skipped"),
        f">= {args.target_share:g}",
        slow.steady / ideal >= args.target_share,
    )
    targets.check(
        "worker peak RSS",
        f"{slow.worker_peak_mb:.0f} MB",
        f"bare aiohttp {held.peak_mb:.0f} MB" if held is not None else "skipped",
        f"< {args.target_rss_mb:g} MB",
        slow.worker_peak_mb < args.target_rss_mb,
    )
    targets.check(
        "agent calls per played turn",
        f"{slow.agent_calls / slow.turns:.3f} ({slow.agent_calls} calls, {slow.turns} turns)",
        "1 call a turn",
        "exactly 1",
        slow.agent_calls == slow.turns,
    )
    sys.exit(targets.exit_code())


if __name__ == "__main__":
    main()
