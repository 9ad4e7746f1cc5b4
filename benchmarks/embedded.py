"""The embedded default against a bare aiohttp loop, whole processes, measured together.

    python -m benchmarks.embedded --cases 1000 --latency-ms 50 --parallel 100 20
    python -m benchmarks.embedded --repeat 8 --against /tmp/before  # another commit too

For each `--parallel` value, two processes run against the same fixed-latency agent
(its own process, started once, served over https with a self-signed certificate
trusted through SSL_CERT_FILE: benchmarks/common.py):
- floor: a bare aiohttp script that sends the 1,000 requests, N at a time, and checks
  each reply contains the expected text: the least any runner must do;
- agenttest: `agenttest-submit -i cases.jsonl -n bench --parallel N` with no broker
  (the embedded default: SQLite store, console report), on 1,000 single-turn cases
  with one `contains` assertion each.
Both are timed from process start to exit (start-up included); CPU time comes from the
kernel's rusage (children included), peak RSS from it and from sampling the process and
its children together. Prints seconds (best and median), the ratios to the floor, peak
memory, and each side's CPU time (user + system) in all and per case. `--against DIR`
runs a checkout of another commit as a third side (`before`), the three alternating, so
that a change is measured against the same drift. `--cpus 0` pins the floor and
agenttest (its children included) to CPU 0, the agent to the rest: the figures of a
one-core machine.

The targets (exit status 1 when one is missed): agenttest's best time at most
`--target-ratio` (2.0) times the floor's best at 100 at a time (at the first
`--parallel` value if 100 is not among them), and as many calls counted at the agent
as cases in each of its runs (none wasted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.common import (
    ProcessTimes,
    Targets,
    compile_bytecode,
    fixed_agent,
    run_timed,
    submit_command,
)

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
    parser.add_argument(
        "--against",
        type=Path,
        help="a checkout of another commit (git worktree add DIR REV): run it too, "
        "alternating with this one and the floor, and print its figures beside",
    )
    parser.add_argument(
        "--target-ratio",
        type=float,
        default=2.0,
        help="the most agenttest's time may be, as a multiple of the floor's, at 100 at a time",
    )
    parser.add_argument(
        "--cpus",
        help="CPUs the floor and agenttest (with its children) run on, as taskset takes "
        "them (`0`: one core); the agent runs on the others",
    )
    args = parser.parse_args()
    compile_bytecode()
    pinned = ["taskset", "-c", args.cpus] if args.cpus else []
    targets = Targets()
    with tempfile.TemporaryDirectory() as tmpdir, fixed_agent(args.latency_ms) as agent:
        # Built once the agent runs: its certificate is trusted through SSL_CERT_FILE.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
        sides = {"agenttest": env}
        if args.against is not None:
            compile_bytecode(args.against)
            # Its modules before this checkout's (an editable install finds its own last).
            sides = {"before": {**env, "PYTHONPATH": str(args.against)}, **sides}
        if args.cpus:
            _pin_elsewhere(agent.pid, args.cpus)
        tmp = Path(tmpdir)
        # The sides run from here, not from this checkout: a process started with
        # `python -m` (a store's process) puts its working directory first on its path,
        # before PYTHONPATH, and `--against`'s side would import this checkout's modules.
        os.chdir(tmp)
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
            f"agent {args.latency_ms:g} ms, whole process (best and median of {args.repeat}, "
            "the sides alternating; memory: the process and its children)"
        )
        for parallel in args.parallel:
            floor_command = [
                *pinned,
                sys.executable,
                "-c",
                FLOOR,
                agent,
                str(args.cases),
                str(parallel),
            ]
            command = [*pinned, *submit_command(cases, config, "--parallel", str(parallel))]
            runs: dict[str, list[ProcessTimes]] = {"floor": [], **{name: [] for name in sides}}
            calls: list[int] = []
            for attempt in range(args.repeat):
                runs["floor"].append(run_timed(floor_command, env))
                for name, side_env in sides.items():
                    home = tmp / f"home-{name}-{parallel}-{attempt}"
                    before = agent.calls()
                    runs[name].append(run_timed(command, {**side_env, "AGENTTEST_HOME": str(home)}))
                    if name == "agenttest":
                        calls.append(agent.calls() - before)
            floor = runs["floor"]
            print(f"  {parallel:>3} at a time:")
            for name, measured in runs.items():
                _print_side(name, measured, floor, args.cases)
            if parallel == (100 if 100 in args.parallel else args.parallel[0]):
                ratio = _best(runs["agenttest"]).seconds / _best(floor).seconds
                targets.check(
                    f"time at {parallel} at a time",
                    f"{_best(runs['agenttest']).seconds:.2f} s, {ratio:.2f}x the floor",
                    f"bare aiohttp {_best(floor).seconds:.2f} s",
                    f"<= {args.target_ratio:g}x",
                    ratio <= args.target_ratio,
                )
            targets.check(
                f"agent calls per case at {parallel} at a time",
                f"{', '.join(str(c) for c in calls)} calls for {args.cases} cases a run",
                "1 call a case",
                "exactly 1",
                all(c == args.cases for c in calls),
            )
    sys.exit(targets.exit_code())


def _pin_elsewhere(pid: int, cpus: str) -> None:
    """The agent's process on the CPUs `cpus` (a taskset list) leaves out, if any."""
    taken: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        taken.update(range(int(first), int(last or first) + 1))
    others = set(os.sched_getaffinity(0)) - taken
    if others:
        os.sched_setaffinity(pid, others)


def _print_side(name: str, runs: list[ProcessTimes], floor: list[ProcessTimes], cases: int) -> None:
    best, median = _best(runs).seconds, statistics.median(run.seconds for run in runs)
    floor_best = _best(floor).seconds
    floor_median = statistics.median(run.seconds for run in floor)
    # CPU varies less than the wall time on a shared machine: what a change to the
    # per-case path did shows here first. The least of each side's runs.
    cpu, floor_cpu = min(run.cpu_s for run in runs), min(run.cpu_s for run in floor)
    ratios = (
        ""
        if runs is floor
        else (
            f"   ratio {best / floor_best:4.2f} (median {median / floor_median:4.2f})"
            f"   CPU ratio {cpu / floor_cpu:4.2f}"
        )
    )
    print(
        f"    {name:<12} {best:5.2f} s (median {median:5.2f})"
        f"  {max(run.peak_kb for run in runs) / 1024:4.0f} MB"
        f"  CPU {cpu:5.2f} s ({cpu / cases * 1000:.2f} ms a case){ratios}"
    )


def _best(runs: list[ProcessTimes]) -> ProcessTimes:
    """The fastest of a side's runs (each side's best against the other's)."""
    return min(runs, key=lambda run: run.seconds)


if __name__ == "__main__":
    main()
