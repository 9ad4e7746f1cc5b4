"""Aggregating a large run: time and peak memory of the process that builds its reports.

    python -m benchmarks.aggregate --cases 3000 12000

For each size, a fresh Postgres database gets a run of N finished 3-turn cases (the
records a real run stores, written as its steps write them: three turns, a `contains`
verdict each), and a new process runs `agenttest_worker.report.aggregation.aggregate` on
it, as the worker that ends a run does.
Prints the time, the process's peak RSS before and after (the difference is what the
aggregation held), and the size of the stored reports. The floors, measured in the same
run: for memory, the process's own start-up (its RSS before aggregating); for time, a
fresh process doing the least any aggregator must (FLOOR): read every case record's
text from Postgres and store it back as one report, streamed with COPY.
Needs Postgres at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import psycopg

from agenttest_worker.results import CaseResult
from benchmarks.common import ROOT, compile_bytecode
from benchmarks.throughput import database

RUN_ID = "bench-aggregate"


def case_record(case_id: str) -> dict[str, object]:
    def turn(number: int) -> dict[str, object]:
        return {
            "turn": number,
            "input": f"message {number}",
            "output": "Noted, thank you.",
            "status": "passed",
            "input_source": "static",
            "assertions": [
                {"type": "contains", "value": "Noted", "passed": True, "reason": "reply contains"}
            ],
            "tool_calls": [],
            "duration_ms": 58,
            "awaiting_input": False,
        }

    return {
        "id": case_id,
        "name": case_id,
        "status": "passed",
        "turns": [turn(n) for n in (1, 2, 3)],
        "final_assertions": [],
        "total_turns": 3,
        "duration_ms": 180,
    }


def _saved(case_id: str) -> str:
    # As a step stores a case's record (store/sql/turns.py): the result model's own JSON.
    return CaseResult.model_validate(case_record(case_id)).model_dump_json()


def store_finished_run(url: str, cases: int) -> None:
    env = {**os.environ, "AGENTTEST_DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", "db", "upgrade"],
        env=env,
        check=True,
        capture_output=True,
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (id, created_at, status, options, config, total_cases,"
            " finished_cases, passed, failed, skipped, total_turns, total_tokens,"
            " total_cost, cancelled) VALUES"
            " (%s, now(), 'running', '{}', '{}', %s, %s, %s, 0, 0, %s, 0, 0, false)",
            (RUN_ID, cases, cases, cases, 3 * cases),
        )
        with conn.cursor() as cursor:
            cursor.executemany(
                'INSERT INTO cases (run_id, case_id, seq, "case", phase, next_turn, deliveries,'
                " status, result) VALUES (%s, %s, %s, '{}', 'done', 4, 0, 'passed', %s)",
                [(RUN_ID, f"c{i}", i, _saved(f"c{i}")) for i in range(cases)],
            )


AGGREGATOR = """
import json, os, resource, sys, time
from agenttest_worker.report.aggregation import aggregate
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
report = aggregate(os.environ["AGENTTEST_DATABASE_URL"], sys.argv[1])
elapsed = time.monotonic() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert report is not None, "the run was not aggregated"
print(json.dumps({"seconds": elapsed, "before_kb": before, "after_kb": after}))
"""


FLOOR = r"""
import sys, time, psycopg
started = time.monotonic()
# One connection reads (a server-side cursor), the other writes: a connection in COPY
# can do nothing else.
with psycopg.connect(sys.argv[1]) as reader, psycopg.connect(sys.argv[1]) as writer:
    writer.execute("CREATE TEMPORARY TABLE floor_reports (format text, content text)")
    with reader.cursor(name="records") as records, writer.cursor().copy(
        "COPY floor_reports FROM STDIN"
    ) as copy:
        records.execute(
            "SELECT result::text FROM cases WHERE run_id = %s ORDER BY seq", (sys.argv[2],)
        )
        copy.write("jsonl\t")
        for (record,) in records:
            copy.write(record.replace("\\", "\\\\") + "\\n")
        copy.write("\n")
print(time.monotonic() - started)
"""


def floor_seconds(url: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", FLOOR, url, RUN_ID],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def measure(url: str) -> dict[str, object]:
    env = {**os.environ, "AGENTTEST_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-c", AGGREGATOR, RUN_ID],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    measured: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT format, length(content) FROM run_reports WHERE run_id = %s", (RUN_ID,)
        ).fetchall()
    measured["sizes"] = dict(rows)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, nargs="+", default=[3000, 12000])
    args = parser.parse_args()
    compile_bytecode()
    print("aggregating a finished run of 3-turn cases (one process per size)")
    for cases in args.cases:
        with database() as url:
            store_finished_run(url, cases)
            floor = floor_seconds(url)
            m = measure(url)
        before, after = int(m["before_kb"]) / 1024, int(m["after_kb"]) / 1024  # type: ignore[call-overload]
        sizes = m["sizes"]
        assert isinstance(sizes, dict)
        seconds = float(m["seconds"])  # type: ignore[arg-type]
        print(
            f"  {cases:>7,} cases: {seconds:5.1f} s (floor {floor:.2f} s:"
            f" {seconds / floor:.1f}x)"
            f"   peak RSS {before:5.0f} -> {after:5.0f} MB (+{after - before:.0f} MB,"
            f" {(after - before) * 1024 / cases:.1f} KB per case)"
            f"   reports: jsonl {sizes['jsonl'] / 1e6:.1f} MB, console"
            f" {sizes['console'] / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
