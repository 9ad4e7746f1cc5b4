"""The embedded default against a bare aiohttp loop, whole processes, measured together.

    python -m benchmarks.embedded --cases 1000 --latency-ms 50 --parallel 100 20

For each `--parallel` value, two processes run against the same fixed-latency agent
(its own process, started once):
- floor: a bare aiohttp script that sends the 1,000 requests, N at a time, and checks
  each reply contains the expected text: the least any runner must do;
- agenttest: `agenttest-submit -i cases.jsonl -n bench --parallel N` with no broker
  (the embedded default: SQLite store, console report), on 1,000 single-turn cases
  with one `contains` assertion each.
Both are timed from process start to exit (start-up included); peak RSS comes from
the kernel's rusage. Prints seconds, the ratio to the floor, and peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import compile_bytecode, submit_command, timed
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
            floor = min(
                timed([sys.executable, "-c", FLOOR, agent, str(args.cases), str(parallel)], env)[:2]
                for _ in range(args.repeat)
            )
            ours_runs = []
            for attempt in range(args.repeat):
                home = tmp / f"home-{parallel}-{attempt}"
                run_env = {**env, "AGENTTEST_HOME": str(home)}
                command = submit_command(cases, config, "--parallel", str(parallel))
                seconds, kb, _ = timed(command, run_env)
                ours_runs.append((seconds, kb))
            ours = min(ours_runs)
            print(
                f"  {parallel:>3} at a time: floor {floor[0]:5.2f} s ({floor[1] / 1024:4.0f} MB)"
                f"   agenttest {ours[0]:5.2f} s ({ours[1] / 1024:4.0f} MB)"
                f"   ratio {ours[0] / floor[0]:4.2f}"
            )


if __name__ == "__main__":
    main()
