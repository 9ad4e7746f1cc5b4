"""Run history at scale: `diff` of two large runs and `history` of one case over 100 runs.

    python -m benchmarks.history --cases 100000 --runs 100

A fresh Postgres database gets a suite of two finished runs of N 3-turn cases (the
records a real run stores; 1% of the cases regress from the first run to the second,
1% are fixed), and --runs more runs of 1,000 cases that all play case `c7`. Then:
- `agenttest-submit diff BASE NEW --format json` in a new process: its wall time and
  peak RSS, against the floor, the same comparison written as plain SQL on the same
  tables (join the two runs' cases on their id, keep the changed ones, read the
  regressions' two records), run by psycopg in a process of its own;
- `agenttest-submit history c7 --suite S --last 100 --format json`: its wall time,
  against plain SQL reading the case's 100 records, and against the process start-up
  alone (`agenttest-submit --version`).
Needs Postgres at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg

from benchmarks.common import ROOT, compile_bytecode
from benchmarks.throughput import database

SUITE = "bench-suite"
HISTORY_CASES = 1000


def record(case_id: str, status: str) -> str:
    def turn(number: int) -> dict[str, object]:
        passed = status == "passed" or number < 3
        return {
            "turn": number,
            "input": f"message {number}",
            "output": "Noted, thank you." if passed else "I cannot help with that.",
            "status": "passed" if passed else "failed",
            "input_source": "static",
            "assertions": [
                {
                    "type": "contains",
                    "value": "Noted",
                    "passed": passed,
                    "reason": "reply contains" if passed else 'reply does not contain "Noted"',
                }
            ],
            "tool_calls": [],
            "duration_ms": 58,
            "awaiting_input": False,
        }

    return json.dumps(
        {
            "id": case_id,
            "name": case_id,
            "status": status,
            "turns": [turn(n) for n in (1, 2, 3)],
            "final_assertions": [],
            "total_turns": 3,
            "duration_ms": 180,
        }
    )


def _rows(run_id: str, cases: int, status_of: dict[int, str]) -> Iterator[tuple[object, ...]]:
    for i in range(cases):
        status = status_of.get(i, "passed")
        yield (run_id, f"c{i}", i, "{}", "done", 4, 0, status, record(f"c{i}", status))


def store_suite(url: str, cases: int, runs: int) -> tuple[str, str]:
    env = {**os.environ, "AGENTTEST_DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", "db", "upgrade"],
        env=env,
        check=True,
        capture_output=True,
    )
    start = datetime.now(UTC) - timedelta(days=runs + 2)
    # 1% regress (passed, then failed), 1% are fixed, 1% keep failing.
    base_status = {i: "failed" for i in range(0, cases, 100)}
    base_status.update({i: "failed" for i in range(2, cases, 100)})
    new_status = {i: "failed" for i in range(1, cases, 100)}
    new_status.update({i: "failed" for i in range(2, cases, 100)})
    plan = [
        (f"hist-{n:03d}", HISTORY_CASES, {7: "failed"} if n % 3 == 0 else {}) for n in range(runs)
    ]
    plan += [("base", cases, base_status), ("new", cases, new_status)]
    with psycopg.connect(url, autocommit=True) as conn:
        for index, (run_id, size, status_of) in enumerate(plan):
            conn.execute(
                "INSERT INTO runs (id, created_at, status, suite, options, config, total_cases,"
                " finished_cases, passed, failed, skipped, total_turns, total_tokens,"
                " total_cost, cancelled) VALUES"
                " (%s, %s, 'done', %s, '{}', '{}', %s, %s, %s, %s, 0, %s, 0, 0, false)",
                (
                    run_id,
                    start + timedelta(days=index),
                    SUITE,
                    size,
                    size,
                    size - len(status_of),
                    len(status_of),
                    3 * size,
                ),
            )
            with (
                conn.cursor() as cursor,
                cursor.copy(
                    'COPY cases (run_id, case_id, seq, "case", phase, next_turn, deliveries,'
                    " status, result) FROM STDIN"
                ) as copy,
            ):
                for row in _rows(run_id, size, status_of):
                    copy.write_row(row)
        conn.execute("ANALYZE")
    return "base", "new"


# agenttest-submit, saying its own peak RSS (KB) on its last stderr line.
CLI = """
import resource, sys
from agenttest_submit.cli.main import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def timed(args: list[str], url: str) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, stdout) of `agenttest-submit ARGS` in a new process."""
    env = {**os.environ, "AGENTTEST_DATABASE_URL": url, "AGENTTEST_BROKER_URL": ""}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CLI, *args], env=env, cwd=ROOT, capture_output=True, text=True
    )
    elapsed = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"agenttest-submit {' '.join(args)} failed:\n{done.stderr}")
    return elapsed, int(done.stderr.strip().splitlines()[-1]) / 1024, done.stdout


PLAIN_DIFF = """
import json, sys, time, psycopg
started = time.monotonic()
with psycopg.connect(sys.argv[1]) as conn:
    changed = conn.execute(
        "SELECT coalesce(n.case_id, b.case_id), b.status, n.status FROM"
        " (SELECT case_id, status FROM cases WHERE run_id = 'base') b FULL JOIN"
        " (SELECT case_id, status FROM cases WHERE run_id = 'new') n ON n.case_id = b.case_id"
        " WHERE b.status IS DISTINCT FROM n.status").fetchall()
    regressions = [c for c, b, n in changed if b == 'passed' and n == 'failed']
    texts = conn.execute(
        "SELECT run_id, case_id, result::text FROM cases WHERE run_id IN ('base', 'new')"
        " AND case_id = ANY(%s)", (regressions,)).fetchall()
    found = {}
    for run_id, case_id, text in texts:
        found.setdefault(case_id, {})[run_id] = json.loads(text)["turns"][2]["output"]
print(time.monotonic() - started, len(changed), len(regressions))
"""

PLAIN_HISTORY = """
import sys, time, psycopg
started = time.monotonic()
with psycopg.connect(sys.argv[1]) as conn:
    rows = conn.execute(
        "SELECT r.id, r.created_at, c.result::text FROM cases c JOIN runs r ON r.id = c.run_id"
        " WHERE r.suite = %s AND c.case_id = 'c7' ORDER BY r.created_at DESC LIMIT 100",
        (sys.argv[2],)).fetchall()
print(time.monotonic() - started, len(rows))
"""


def plain(script: str, *args: str) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, what it printed) of a plain-SQL script in a new process."""
    script += "\nimport resource\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    )
    elapsed = time.monotonic() - started
    said, peak = done.stdout.strip().splitlines()
    return elapsed, int(peak) / 1024, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    compile_bytecode()
    with database() as url:
        print(f"storing a suite: 2 runs of {args.cases:,} cases, {args.runs} of {HISTORY_CASES:,}")
        began = time.monotonic()
        base, new = store_suite(url, args.cases, args.runs)
        print(f"  stored in {time.monotonic() - began:.0f} s")
        startup, startup_rss, _ = timed(["--version"], url)
        seconds, rss, out = timed(["diff", base, new, "--format", "json"], url)
        counts = json.loads(out)["counts"]
        floor, floor_rss, said = plain(PLAIN_DIFF, url)
        floor_query = float(said.split()[0])
        print(
            f"diff of two {args.cases:,}-case runs: {seconds:.2f} s, peak RSS {rss:.0f} MB"
            f" ({counts['regression']:,} regressions, {counts['fixed']:,} fixed,"
            f" {counts['still_failing']:,} still failing)"
        )
        print(
            f"  floor, plain SQL in a process: {floor:.2f} s ({floor_query:.2f} s of queries),"
            f" peak RSS {floor_rss:.0f} MB; ratio {seconds / floor:.1f}x;"
            f" start-up alone {startup:.2f} s, {startup_rss:.0f} MB"
        )
        last = min(args.runs, 100)
        h_seconds, h_rss, out = timed(
            ["history", "c7", "--suite", SUITE, "--last", str(last), "--format", "json"], url
        )
        played = len(json.loads(out)["runs"])
        h_floor, _, said = plain(PLAIN_HISTORY, url, SUITE)
        print(f"history of one case over {played} runs: {h_seconds:.2f} s, peak RSS {h_rss:.0f} MB")
        print(
            f"  floor, plain SQL in a process: {h_floor:.2f} s; ratio {h_seconds / h_floor:.1f}x;"
            f" over start-up alone: {h_seconds - startup:.2f} s"
        )


if __name__ == "__main__":
    main()
