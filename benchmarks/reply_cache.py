"""What the reply cache saves a judged suite run again: judge calls, wall time and cost.

    python -m benchmarks.reply_cache --cases 100 --latency-ms 200

The counting agent of benchmarks/repeat_cost.py runs in its own process: model `bench`
answers as the target, model `judge` as a judge ({"passed": true}), each after
`--latency-ms`, with the same usage every call, both priced. The judge's entry has
`params: {temperature: 0}`: its replies are stable, so cached by default; the target's
are not. The suite: `--cases` cases of two static turns, each judged by an `agent`
assertion. Embedded (SQLite), `--parallel`:

- the floor: the suite with `--no-cache` (every agent called, nothing stored), in a
  store of its own;
- the first run with the cache, in a new store: every judge called, its replies stored;
- the second run in the same store: the judges' replies served from it.

For each: the calls counted at the agent by model, the whole process's wall time, and
the run's cost as `agenttest-submit runs` shows it. The second run's judge calls must
be at most 5% of the first's (the benchmark exits 1 otherwise). Best of `--rounds`
(each round a new store), by the second run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BIN, compile_bytecode, run_timed, submit_command
from benchmarks.repeat_cost import counting_agent, take_counts
from benchmarks.repeat_cost import write_suite as write_judged_suite

# At most this share of the first run's judge calls are made again by the second.
MOST_CALLED_AGAIN = 0.05


@dataclass
class Played:
    seconds: float
    calls: Counter[str]
    cost: float


def stable_judge(config: Path) -> None:
    """The judge's replies meant to be stable (temperature 0): cached by default."""
    project = json.loads(config.read_text())
    project["agents"]["judge"]["params"] = {"temperature": 0}
    config.write_text(json.dumps(project))


def play(agent: str, home: Path, cases: Path, config: Path, parallel: int, *extra: str) -> Played:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env["AGENTTEST_HOME"] = str(home)
    take_counts(agent)
    command = submit_command(cases, config, "--parallel", str(parallel), *extra)
    times = run_timed(command, env)
    calls = take_counts(agent)
    cost = listed_runs(env)[0]["cost"]
    assert isinstance(cost, float | int)
    return Played(times.seconds, calls, float(cost))


def listed_runs(env: dict[str, str]) -> list[dict[str, object]]:
    """`agenttest-submit runs --format json` in the store `env` names: newest first."""
    command = [str(BIN / "agenttest-submit"), "runs", "--format", "json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"{command[1]} exited {done.returncode}: {done.stderr[-2000:]}")
    found: list[dict[str, object]] = json.loads(done.stdout)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--parallel", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="rounds; the best counts")
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmpdir, counting_agent(args.latency_ms) as agent:
        tmp = Path(tmpdir)
        config, cases = write_judged_suite(tmp, agent, args.cases)
        stable_judge(config)
        rounds: list[tuple[Played, Played, Played]] = []
        for number in range(args.rounds):
            stamp = f"{number}-{time.monotonic_ns()}"
            floor = play(agent, tmp / f"floor-{stamp}", cases, config, args.parallel, "--no-cache")
            home = tmp / f"cached-{stamp}"
            first = play(agent, home, cases, config, args.parallel)
            second = play(agent, home, cases, config, args.parallel)
            rounds.append((floor, first, second))
        floor, first, second = min(rounds, key=lambda r: r[2].seconds)
    print(
        f"reply cache: {args.cases} cases of 2 judged turns (2 target + 2 judge calls each), "
        f"agent {args.latency_ms:g} ms, --parallel {args.parallel}, embedded, "
        f"best of {args.rounds}"
    )
    print(f"  {'run':<28} {'target calls':>12} {'judge calls':>12} {'wall s':>8} {'cost':>9}")
    for name, played in (
        ("floor (--no-cache)", floor),
        ("first (cache empty)", first),
        ("second (same store)", second),
    ):
        print(
            f"  {name:<28} {played.calls['bench']:>12,} {played.calls['judge']:>12,}"
            f" {played.seconds:>8.2f} {played.cost:>9.4f}"
        )
    share = second.calls["judge"] / max(first.calls["judge"], 1)
    print(
        f"  second/first: judge calls {share:.1%}, wall time {second.seconds / first.seconds:.2f}×,"
        f" cost {second.cost / first.cost:.2f}×; first/floor: wall time"
        f" {first.seconds / floor.seconds:.2f}×"
    )
    if share > MOST_CALLED_AGAIN:
        raise SystemExit(f"the second run called {share:.1%} of the judges again (at most 5%)")


if __name__ == "__main__":
    main()
