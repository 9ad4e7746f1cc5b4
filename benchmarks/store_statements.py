"""Postgres CPU per statement of a turn, against the floor chain's insert, in one run.

    python -m benchmarks.store_statements --cases 3000 --threads 1 4 16

Calls the worker's own reads and writes (SqlStore.load_case, .save_step) from a pool of
threads against a fresh database, as workers do, and the floor chain's one INSERT per
turn (benchmarks/floor_chain.py) the same way, and prints the Postgres CPU (all server
processes) and the caller's own CPU (this process: building the step and sending it,
as a worker does) per call of each kind: a conversation's load, the save of a middle step, the
save of the step that ends it (which also counts it on the run's row, in the same
transaction), and a bare increment of that row. Each `--threads` count is measured
with the same connections throughout (a connection that closed would take its
server process's CPU out of the sum).

Needs Postgres at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import psycopg

from benchmarks.common import BIN
from benchmarks.throughput import database

WARM_UP = 200  # calls per kind before measuring: connections opened, statements prepared


def postgres_cpu_seconds() -> float:
    """CPU time used so far by the live Postgres server processes, to the nanosecond
    (schedstat: a statement costs tens of microseconds, and /proc/PID/stat counts whole
    clock ticks per process)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if "(postgres)" not in stat.read_text():
                continue
            total += int((stat.parent / "schedstat").read_text().split()[0])
        except OSError:
            continue  # exited meanwhile
    return total / 1e9


class PerCall(NamedTuple):
    postgres: float  # CPU seconds per call, all server processes
    caller: float  # CPU seconds per call, this process


def measure(pool: ThreadPoolExecutor, calls: int, call: Callable[[int], object]) -> PerCall:
    """CPU seconds per call of `call(i)` for i past the warm-up."""
    list(pool.map(call, range(WARM_UP)))
    before, own_before = postgres_cpu_seconds(), time.process_time()
    list(pool.map(call, range(WARM_UP, calls)))
    measured = calls - WARM_UP
    return PerCall(
        (postgres_cpu_seconds() - before) / measured,
        (time.process_time() - own_before) / measured,
    )


def run(cases: int, threads: int) -> dict[str, PerCall]:
    from agenttest_worker.results import (
        AgentCallRecord,
        AssertionResult,
        CaseResult,
        TurnResult,
    )
    from agenttest_worker.store import runs
    from agenttest_worker.store.base import SqlStore
    from agenttest_worker.store.db import get_engine
    from agenttest_worker.store.steps import JsonText, Step, new_run_id

    figures: dict[str, PerCall] = {}
    with database() as db, ThreadPoolExecutor(threads) as pool:
        env = {**os.environ, "AGENTTEST_DATABASE_URL": db}
        subprocess.run(
            [str(BIN / "agenttest-submit"), "db", "upgrade"],
            env=env,
            check=True,
            capture_output=True,
        )
        run_id = new_run_id()
        runs.create_run(
            db, run_id=run_id, agent="bench", input_label="bench", options={}, config={}
        )
        turns = [
            {"input": f"message {t}", "assertions": [{"type": "contains", "value": "Noted"}]}
            for t in range(1, 4)
        ]
        runs.add_cases(
            db,
            run_id,
            [
                runs.NewCase(i, f"c{i}", {"id": f"c{i}", "turns": turns, "max_turns": 3}, None)
                for i in range(cases)
            ],
        )
        runs.start_run(db, run_id, cases)
        store = SqlStore(db)

        def turn(number: int) -> TurnResult:
            return TurnResult(
                turn=number,
                input=f"message {number}",
                input_source="static",
                output="Noted, thank you.",
                assertions=[AssertionResult(type="contains", passed=True, reason="found")],
                calls=[
                    AgentCallRecord(
                        role="target", agent="bench", latency_ms=50, attempts=1, status_code=200
                    )
                ],
                duration_ms=51,
            )

        def save(number: int, ends: bool) -> Callable[[int], object]:
            def call(i: int) -> object:
                ran = [turn(t) for t in range(1, number + 1)]
                messages = [
                    {"role": role, "content": text}
                    for t in ran
                    for role, text in (("user", t.input), ("assistant", t.output))
                ]
                recorded = ",".join(t.model_dump_json() for t in ran)
                state = JsonText(
                    f'{{"case_id": "c{i}", "session_id": "s", "phase": "ready", '
                    f'"messages": {json.dumps(messages)}, "turns": [{recorded}]}}'
                )
                result = (
                    CaseResult(id=f"c{i}", status="passed", turns=ran, total_turns=number)
                    if ends
                    else None
                )
                saved = store.save_step(
                    Step(
                        run_id=run_id,
                        case_id=f"c{i}",
                        expected_turn=number,
                        next_turn=number + 1,
                        phase="done" if ends else "ready",
                        state=state,
                        new_turns=[ran[-1]],
                        result=result,
                    )
                )
                if not saved.saved:
                    raise SystemExit(f"step {number} of c{i} was not saved")
                return saved

            return call

        figures["load a conversation"] = measure(
            pool, cases, lambda i: store.load_case(run_id, f"c{i}", False, 1)
        )
        figures["save a middle step (turn 1)"] = measure(pool, cases, save(1, False))
        figures["save a middle step (turn 2)"] = measure(pool, cases, save(2, False))
        figures["save the last step (turn 3)"] = measure(pool, cases, save(3, True))

        # The floor chain's write, and the run row alone, on connections of their own
        # (one per thread, kept for the whole measurement).
        local = threading.local()
        opened: list[psycopg.Connection[tuple[object, ...]]] = []

        def connection() -> psycopg.Connection[tuple[object, ...]]:
            found = getattr(local, "connection", None)
            if found is None:
                found = local.connection = psycopg.connect(db, autocommit=True)
                opened.append(found)
            return found

        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute(
                "CREATE TABLE floor_turns (conversation text, turn int, output text, "
                "created_at timestamptz DEFAULT now(), PRIMARY KEY (conversation, turn))"
            )
        figures["floor: insert a turn"] = measure(
            pool,
            cases,
            lambda i: connection().execute(
                "INSERT INTO floor_turns (conversation, turn, output) VALUES (%s, %s, %s)",
                (f"c{i}", 1, "Noted, thank you."),
            ),
        )
        figures["count a case on the run row alone"] = measure(
            pool,
            cases,
            lambda i: (
                connection()
                .execute(
                    "UPDATE runs SET finished_cases = finished_cases + 1 WHERE id = %s"
                    " RETURNING finished_cases, total_cases, status",
                    (run_id,),
                )
                .fetchone()
            ),
        )
        for opened_connection in opened:
            opened_connection.close()
        get_engine(db).dispose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    if args.cases <= WARM_UP:
        raise SystemExit(f"--cases must be above {WARM_UP} (the warm-up)")
    results = {threads: run(args.cases, threads) for threads in args.threads}
    kinds = list(next(iter(results.values())))
    print(
        f"CPU per call (ms): Postgres (all server processes) / the caller (this process), "
        f"{args.cases:,} cases, by threads calling at once"
    )
    print(f"  {'':36s}" + "".join(f"{t:>16d}" for t in args.threads))
    for kind in kinds:
        row = "".join(
            f"{results[t][kind].postgres * 1000:8.3f}/{results[t][kind].caller * 1000:<7.3f}"
            for t in args.threads
        )
        print(f"  {kind:36s}{row}")


if __name__ == "__main__":
    main()
