"""The embedded default against a bare aiohttp loop, whole processes, measured together.

    python -m benchmarks.embedded --cases 1000 --latency-ms 50 --parallel 100 20

For each `--parallel` value, two processes run against the same fixed-latency agent
(its own process, started once):
- floor: a bare aiohttp script that sends the 1,000 requests, N at a time, and checks
  each reply contains the expected text: the least any runner must do;
- agenttest: `agenttest-submit -i cases.jsonl -n bench --parallel N` with no broker
  (the embedded default: SQLite store, console report), on 1,000 single-turn cases
  with one `contains` assertion each.
Both are timed from process start to exit (start-up included); peak RSS and CPU time
come from the kernel's rusage. Prints seconds, the ratio to the floor, peak memory, and
each side's CPU time (user + system) in all and per case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ProcessTimes, compile_bytecode, run_timed, submit_command
from benchmarks.throughput import fixed_agent

FLOOR = r"""
import asyncio, sys, aiohttp
url, count, parallel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=parallel)) as s:
        sem = asyncio.Semaphore(parallel)
        passed = 0
        async def one(i):
            nonlocal passed
            async with sem:
                body = {"model": "bench", "messages": [{"role": "user", "content": f"m{i}"}]}
                async with s.post(url + "/chat/completions", json=body) as r:
                    data = await r.json()
                    passed += "Noted" in data["choices"][0]["message"]["content"]
        await asyncio.gather(*(one(i) for i in range(count)))
        assert passed == count, passed

asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--parallel", type=int, nargs="+", default=[100, 20])
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; the best counts")
    args = parser.parse_args()
    compile_bytecode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    with tempfile.TemporaryDirectory() as tmpdir, fixed_agent(args.latency_ms) as agent:
        tmp = Path(tmpdir)
        cases = tmp / "cases.jsonl"
        with cases.open("w") as handle:
            for i in range(args.cases):
                case = {
                    "id": f"c{i:04d}",
                    "input": f"message {i}",
                    "assertions": [{"type": "contains", "value": "Noted"}],
                }
                handle.write(json.dumps(case) + "\n")
        config = tmp / "agenttest.yaml"
        config.write_text(f"agents:\n  bench:\n    base_url: {agent}\n    model: bench\n")
        print(
            f"embedded default: {args.cases:,} single-turn cases, one `contains` each, "
            f"agent {args.latency_ms:g} ms, whole process (best of {args.repeat})"
        )
        for parallel in args.parallel:
            floor_command = [sys.executable, "-c", FLOOR, agent, str(args.cases), str(parallel)]
            floor_runs = [run_timed(floor_command, env) for _ in range(args.repeat)]
            ours_runs = []
            for attempt in range(args.repeat):
                home = tmp / f"home-{parallel}-{attempt}"
                run_env = {**env, "AGENTTEST_HOME": str(home)}
                command = submit_command(cases, config, "--parallel", str(parallel))
                ours_runs.append(run_timed(command, run_env))
            floor, ours = _best(floor_runs), _best(ours_runs)
            print(
                f"  {parallel:>3} at a time: floor {floor.seconds:5.2f} s"
                f" ({floor.peak_kb / 1024:4.0f} MB)"
                f"   agenttest {ours.seconds:5.2f} s ({ours.peak_kb / 1024:4.0f} MB)"
                f"   ratio {ours.seconds / floor.seconds:4.2f}"
            )
            # CPU varies less than the wall time on a shared machine: what a change to the
            # per-case path did shows here first. The least of each side's runs.
            floor_cpu = min(run.cpu_s for run in floor_runs)
            ours_cpu = min(run.cpu_s for run in ours_runs)
            print(
                f"      CPU, whole process: floor {floor_cpu:5.2f} s"
                f" ({floor_cpu / args.cases * 1000:.2f} ms a case)"
                f"   agenttest {ours_cpu:5.2f} s ({ours_cpu / args.cases * 1000:.2f} ms a case)"
                f"   ratio {ours_cpu / floor_cpu:4.2f}"
            )


def _best(runs: list[ProcessTimes]) -> ProcessTimes:
    """The fastest of a side's runs (each side's best against the other's)."""
    return min(runs, key=lambda run: run.seconds)


if __name__ == "__main__":
    main()
