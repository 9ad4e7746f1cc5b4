"""What `--repeat auto` saves: calls against a fixed K, at the same rate of wrong verdicts.

    python -m benchmarks.adaptive_repeats --max-repeat 10 --rule majority \
        --rates 0 0.1 0.2 0.3 0.4 0.6 0.7 0.8 0.9 1 --cases 10 --trials 20000

A population of coin-flip cases whose pass rates are known: each case asks the demo's
"coin" model (agenttest_worker/demo/coin.py) for "heads" with its own probability
(`p=0.3`), so its true verdict under the pass rule is known (majority: passed when the
rate is above one half; a rate of exactly the threshold has no right verdict and is
left out). A verdict is wrong when it is not the true one.

1. End to end: the population (`--cases` cases per rate) played by `agenttest-submit`,
   embedded, once with `--repeat K` and once with `--repeat auto --max-repeat K`, the
   demo agents served in this process. Calls are the target calls of the run's JSON
   report (`usage_by_role`), wrong verdicts read from its `cases`.
2. The same rule, many times over: the stopping rule the stores ask
   (report/repeat_stopping.py `next_repetition`) run `--trials` times per rate, its
   repetitions started START_WIDTH at a time and ending in the order they started, as
   against every fixed K' from 1 to K. It prints the calls and wrong-verdict rate of
   each, what auto saves against K, and against the smallest K' whose rate of wrong
   verdicts is no higher than auto's: the saving at the same rate of wrong verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agenttest_worker.demo.demo_server import DemoServer
from agenttest_worker.report.repeat_stopping import START_WIDTH, next_repetition, threshold
from agenttest_worker.report.verdicts import verdict
from agenttest_worker.results import CaseStatus


def truth(rule: str, rate: float) -> CaseStatus | None:
    """The verdict a case with this true pass rate deserves, or None (at the threshold)."""
    if rule == "all":
        return "passed" if rate == 1 else "failed"
    if rule == "any":
        return "passed" if rate > 0 else "failed"
    share = threshold(rule)
    assert share is not None
    if rate == share:
        return None
    if rule == "majority":
        return "passed" if rate > share else "failed"
    return "passed" if rate >= share else "failed"


@dataclass
class Tally:
    calls: int = 0
    cases: int = 0
    wrong: int = 0

    def add(self, calls: int, found: CaseStatus, right: CaseStatus | None) -> None:
        self.calls += calls
        if right is not None:
            self.cases += 1
            self.wrong += found != right

    @property
    def wrong_rate(self) -> float:
        return self.wrong / self.cases if self.cases else 0.0


# -- 1. end to end ----------------------------------------------------------------------


def end_to_end(rule: str, bound: int, rates: list[float], per_rate: int) -> dict[str, Tally]:
    """Fixed K and auto, each one embedded run of the population."""
    found: dict[str, Tally] = {}
    with DemoServer(port=0) as server, tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        entry = {"protocol": "openai", "base_url": server.base_url, "model": "coin"}
        (work / "agenttest.yaml").write_text(json.dumps({"agents": {"coin": {**entry}}}))
        cases = [
            {
                "id": f"rate-{rate}-{i}",
                "input": f"p={rate} throw the coin",
                "assertions": [{"type": "equals", "value": "heads"}],
            }
            for rate in rates
            for i in range(per_rate)
        ]
        (work / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
        rate_of = {c["id"]: float(str(c["input"]).split()[0][2:]) for c in cases}
        env = {**os.environ, "AGENTTEST_HOME": str(work / "home")}
        plays = (("fixed", [str(bound)]), ("auto", ["auto", "--max-repeat", str(bound)]))
        for name, repeat in plays:
            command = [sys.executable, "-m", "agenttest_submit.cli", "-i", "cases.jsonl"]
            command += ["-n", "coin", "--pass-rule", rule, "--format", "json"]
            command += ["--parallel", "20", "--repeat", *repeat]
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
            if done.returncode not in (0, 1):
                raise SystemExit(f"the {name} run failed ({done.returncode}):\n{done.stderr}")
            report = json.loads(done.stdout)
            tally = Tally()
            for case in report["cases"]:
                tally.add(0, case["status"], truth(rule, rate_of[case["id"]]))
            tally.calls = report["usage_by_role"]["target"]["calls"]
            found[name] = tally
    return found


# -- 2. the rule, many times over -------------------------------------------------------


def adaptive(rule: str, bound: int, rate: float, throw: random.Random) -> tuple[int, CaseStatus]:
    """One case played as the stores play it: START_WIDTH at once, each repetition that
    ends asking for the next (they end in the order they started)."""
    created = min(START_WIDTH, bound)
    ended: list[CaseStatus] = []
    while len(ended) < created:
        ended.append("passed" if throw.random() < rate else "failed")
        more = next_repetition(rule, bound, ended, created)
        if more is not None:
            created = more
    return created, verdict(ended, rule)


def simulated(
    rule: str, bound: int, rates: list[float], trials: int, seed: int
) -> tuple[Tally, dict[int, Tally]]:
    throw = random.Random(seed)
    auto, fixed = Tally(), {k: Tally() for k in range(1, bound + 1)}
    for rate in rates:
        right = truth(rule, rate)
        for _ in range(trials):
            calls, found = adaptive(rule, bound, rate, throw)
            auto.add(calls, found, right)
            throws: list[CaseStatus] = [
                "passed" if throw.random() < rate else "failed" for _ in range(bound)
            ]
            for k, tally in fixed.items():
                tally.add(k, verdict(throws[:k], rule), right)
    return auto, fixed


def _line(name: str, tally: Tally, cases: int) -> str:
    return (
        f"  {name:<22} {tally.calls:>9,} calls ({tally.calls / cases:5.2f} a case)   "
        f"wrong verdicts {tally.wrong_rate:6.2%} ({tally.wrong}/{tally.cases})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-repeat", type=int, default=10)
    parser.add_argument("--rule", default="majority")
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9, 1]
    )
    parser.add_argument("--cases", type=int, default=10, help="cases per rate, end to end")
    parser.add_argument("--trials", type=int, default=20000, help="cases per rate, simulated")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    bound, rule, rates = args.max_repeat, args.rule, args.rates

    print(f"pass rule {rule}, K = {bound}, true pass rates {rates}")
    cases = len(rates) * args.cases
    runs = end_to_end(rule, bound, rates, args.cases)
    print(f"\n1. end to end: {cases} cases, embedded, against the demo's coin")
    print(_line(f"--repeat {bound}", runs["fixed"], cases))
    print(_line("--repeat auto", runs["auto"], cases))
    saved = 1 - runs["auto"].calls / runs["fixed"].calls
    print(f"  saving: {saved:.1%} of the calls")

    auto, fixed = simulated(rule, bound, rates, args.trials, args.seed)
    cases = len(rates) * args.trials
    print(f"\n2. the stopping rule, {cases:,} cases ({args.trials:,} per rate)")
    for k, tally in fixed.items():
        print(_line(f"--repeat {k}", tally, cases))
    print(_line("--repeat auto", auto, cases))
    print(f"  saving against --repeat {bound}: {1 - auto.calls / fixed[bound].calls:.1%}")
    same = [k for k, tally in fixed.items() if tally.wrong_rate <= auto.wrong_rate]
    if same:
        k = min(same)
        print(
            f"  saving at the same rate of wrong verdicts (--repeat {k}, the fewest fixed "
            f"repetitions as right as auto): {1 - auto.calls / fixed[k].calls:.1%}"
        )
    else:
        print(f"  no fixed K up to {bound} is as right as auto")


if __name__ == "__main__":
    main()
