"""A big case file on the embedded default: peak memory, and how soon --deadline ends it.

    python -m benchmarks.big_case_file --cases 1000000 --deadline 30

Writes `--cases` single-turn cases (one `contains` each) to one JSONL file, and runs
`agenttest-submit` on it, embedded (SQLite in a fresh AGENTTEST_HOME), against the
fixed agent (benchmarks/fixed_agent.py, its own process) answering after
`--latency-ms`, with `--deadline`: the run reads, checks and stores every case, plays
what it can until the deadline, then ends the rest. Prints the whole process's peak
RSS (the process and its children) beside the target (≤ 500 MB); how long the reading
and checking of the file took (the deadline counts from the run's start, once every case
is checked); and when the process ended after its run's deadline (read from the run's
`deadline_at` in the store) beside the target (within seconds of it: the cases never
started ended at once, the report written). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Targets, fixed_agent, run_timed, submit_command

PEAK_TARGET_MB = 500
# What "within seconds of its deadline" allows past it.
END_SLACK_S = 10.0


def write_cases(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            case = {
                "id": f"c{i:07d}",
                "input": f"message {i}",
                "assertions": [{"type": "contains", "value": "Noted"}],
            }
            handle.write(json.dumps(case) + "\n")


def _deadline_at(home: Path) -> float:
    """The run's deadline (epoch seconds), as its store under AGENTTEST_HOME keeps it."""
    [database] = home.glob("*.db")
    with sqlite3.connect(database) as connection:
        (found,) = connection.execute("SELECT deadline_at FROM runs").fetchone()
    return float(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=1_000_000)
    parser.add_argument("--deadline", type=float, default=30.0, help="seconds")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir, fixed_agent(args.latency_ms) as agent:
        tmp = Path(tmpdir)
        os.chdir(tmp)
        cases = tmp / "cases.jsonl"
        write_cases(cases, args.cases)
        config = tmp / "agenttest.yaml"
        config.write_text(f"agents:\n  bench:\n    base_url: {agent}\n    model: bench\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
        env["AGENTTEST_HOME"] = str(tmp / "home")
        command = submit_command(cases, config, "--deadline", f"{args.deadline:g}s")
        command += ["-o", str(tmp / "out.jsonl")]
        print(
            f"embedded default: {args.cases:,} single-turn cases in one file, agent "
            f"{args.latency_ms:g} ms, --deadline {args.deadline:g}s (whole process)"
        )
        # Exit 1: the cases the deadline ended failed.
        started = time.time()
        times = run_timed(command, env, ok=(0, 1))
        ended = time.time()
        records = sum(1 for _ in (tmp / "out.jsonl").open(encoding="utf-8"))
        print(f"  {records:,} records written, {agent.calls():,} agent calls")
        deadline_at = _deadline_at(tmp / "home")
        checking = deadline_at - args.deadline - started
        print(f"  reading and checking the file, storing begun: {checking:,.1f} s")
    peak_mb = times.peak_kb / 1024
    targets = Targets()
    targets.check(
        "peak RSS",
        f"{peak_mb:,.0f} MB",
        "-",
        f"≤ {PEAK_TARGET_MB} MB",
        peak_mb <= PEAK_TARGET_MB,
    )
    after = ended - deadline_at
    targets.check(
        "end after the deadline",
        f"{after:,.1f} s",
        "0 s",
        f"≤ {END_SLACK_S:g} s",
        after <= END_SLACK_S and records == args.cases,
    )
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
