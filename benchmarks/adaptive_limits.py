"""A fleet against a provider's rate limit it was not told about: how close to the
provider's pace it runs, and how few of its calls are refused.

    python -m benchmarks.adaptive_limits
    python -m benchmarks.adaptive_limits --per-second 40 --cases 2400 --concurrency 25

Two Celery workers (`-c --concurrency` each, their default pool), real Redis and
Postgres, and the agent of benchmarks/fixed_agent.py over https in its own process,
answering after `--latency-ms` and allowing `--per-second` requests a second (a token
bucket holding one second's worth; 429 with retry-after beyond; OpenAI's rate-limit
headers on every reply). `--cases` single-turn cases, and no `rate_limit` in
agenttest.yaml: the workers learn the limit from the provider (its headers, its 429s).
The workers together may start more calls at once than the provider allows, so the run
begins above the limit.

It prints the run time (the run's own, from its creation to its end as stored; the
submitter's start-up, which no provider changes, is printed beside it), the ideal (the
calls at the provider's pace: cases / per-second) as the floor, their ratio, the share
of 429s among the calls the agent got, and the calls per turn.

The targets (exit status 1 when one is missed): the run time at most `--target-ratio`
(1.15) times the ideal, 429s under `--target-refused` (2%) of the calls, and every turn
answered exactly once (no call lost or doubled).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks.common import (
    BIN,
    Targets,
    add_settings_option,
    compile_bytecode,
    rate_limited_agent,
    submit_command,
)
from benchmarks.throughput import (
    Stall,
    Worker,
    database,
    log,
    redis_db,
    stopping_workers,
    wait_for_run,
    write_suite,
)

WORKERS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-second", type=float, default=40.0, help="the provider's limit")
    parser.add_argument("--cases", type=int, default=2400, help="single-turn cases")
    parser.add_argument("--latency-ms", type=float, default=500.0, help="the agent's latency")
    parser.add_argument("--concurrency", type=int, default=25, help="each worker's -c")
    add_settings_option(parser)
    parser.add_argument("--target-ratio", type=float, default=1.15)
    parser.add_argument("--target-refused", type=float, default=0.02)
    args = parser.parse_args()
    compile_bytecode()
    with (
        tempfile.TemporaryDirectory() as tmpdir,
        rate_limited_agent(args.latency_ms, args.per_second) as agent,
        redis_db() as broker,
        database() as db,
        stopping_workers(),
    ):
        tmp = Path(tmpdir)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
            "AGENTTEST_BROKER_URL": broker,
            "AGENTTEST_DATABASE_URL": db,
            "AGENTTEST_WORKER_CONCURRENCY": str(args.concurrency),
            **dict(args.env),
        }
        subprocess.run(
            [str(BIN / "agenttest-submit"), "db", "upgrade"],
            env=env,
            check=True,
            capture_output=True,
        )
        workers = [
            Worker("agenttest_worker", env, args.concurrency, "agenttest", tmp / f"w{i}.log", None)
            for i in range(WORKERS)
        ]
        for worker in workers:
            worker.wait_ready(broker, "agenttest")
        cases, config = write_suite(tmp, args.cases, 1, agent, agent_timeout=60)
        # The suite's agent gives up on its first failure: here a 429 is retried, as any
        # agent entry does by default.
        config.write_text(config.read_text().replace("max_retries: 0", "max_retries: 5"))
        log(
            f"{args.cases} cases, {WORKERS} workers x -c {args.concurrency}, provider at "
            f"{args.per_second:g}/s answering after {args.latency_ms:g} ms"
        )
        started = time.monotonic()
        started_at = time.time()  # the database's clock is this machine's
        submitted = subprocess.run(
            submit_command(cases, config, "--no-wait"), env=env, capture_output=True, text=True
        )
        if submitted.returncode != 0:
            raise SystemExit(f"submitter failed: {submitted.stderr}")
        with psycopg.connect(db, autocommit=True) as conn:
            watch = Stall("adaptive", [w.log_path for w in workers])
            wait_for_run(conn, watch, args.cases, tick=0.1, workers=workers)
            elapsed = time.monotonic() - started
            rows, distinct, passed = conn.execute(
                "SELECT count(*), count(DISTINCT (case_id, turn)),"
                " count(*) FILTER (WHERE status = 'passed') FROM turns"
            ).fetchone()  # type: ignore[misc]
            created, first_turn, last_turn, finished = conn.execute(
                "SELECT extract(epoch FROM r.created_at),"
                " extract(epoch FROM min(t.created_at) - r.created_at),"
                " extract(epoch FROM max(t.created_at) - r.created_at),"
                " extract(epoch FROM r.finished_at - r.created_at)"
                " FROM runs r JOIN turns t ON t.run_id = r.id GROUP BY r.id"
            ).fetchone()  # type: ignore[misc]
            # Turns saved second by second: where the run went slower than the provider.
            profile = conn.execute(
                "SELECT floor(extract(epoch FROM created_at - (SELECT min(created_at)"
                " FROM turns)))::int AS second, count(*) FROM turns GROUP BY 1 ORDER BY 1"
            ).fetchall()
        log(
            f"phases: run created at {float(created) - started_at:.2f} s; from its creation: "
            f"first turn saved {first_turn:.2f} s, last turn {last_turn:.2f} s, "
            f"run finished {finished:.2f} s; total {elapsed:.2f} s"
        )
        log("turns saved per second: " + " ".join(str(n) for _, n in profile))
        calls, refused = agent.calls(), agent.refused()
        log(f"429s at (s from the first call): {agent.refused_at()}")
        answered = sum(agent.answered().values())
    if rows != args.cases or distinct != args.cases:
        raise SystemExit(f"{rows} turn rows, {distinct} distinct, of {args.cases}")
    ideal = args.cases / args.per_second
    run_time = float(finished)
    ratio = run_time / ideal
    share = refused / calls
    print(
        f"adaptive limits: {WORKERS} workers x -c {args.concurrency}, {args.cases} single-turn "
        f"cases, provider at {args.per_second:g} requests/s ({args.latency_ms:g} ms a reply), "
        "no rate_limit configured"
    )
    print(
        f"  run time {run_time:.1f} s ({elapsed:.1f} s from the submitter's start); ideal "
        f"{args.cases} calls / {args.per_second:g} per s = {ideal:.1f} s; ratio {ratio:.3f}"
    )
    print(
        f"  agent calls {calls}: {answered} answered, {refused} refused with 429 "
        f"({share:.2%}); {calls / args.cases:.3f} calls per turn, "
        f"{answered / args.cases:.3f} answered per turn; {passed} turns passed"
    )
    targets = Targets()
    targets.check(
        "run time over the ideal",
        f"{ratio:.3f} ({run_time:.1f} s of {ideal:.1f} s)",
        "1 (calls / R)",
        f"<= {args.target_ratio:g}",
        ratio <= args.target_ratio,
    )
    targets.check(
        "share of 429s among the calls",
        f"{share:.2%} ({refused} of {calls})",
        "0",
        f"< {args.target_refused:.0%}",
        share < args.target_refused,
    )
    targets.check(
        "answered calls per turn",
        f"{answered / args.cases:.3f} ({answered} answered, {args.cases} turns)",
        "1 call a turn",
        "exactly 1",
        answered == args.cases and passed == args.cases,
    )
    sys.exit(targets.exit_code())


if __name__ == "__main__":
    main()
