"""What `--repeat K` costs: K times the calls, and the same runner time per turn.

    python -m benchmarks.repeat_cost --cases 100 --repeats 1 5 10 --latency-ms 20

One counting agent runs in its own process (its CPU is not the runner's): model
`bench` answers as a target, model `judge` as a validator ({"passed": true}), each
after `--latency-ms` and with the same usage every call; it counts the requests it
gets by model. The suite: `--cases` cases of two static turns, each turn judged by an
`agent` assertion (two target calls and two judge calls a conversation), with pricing
for both agents. For each K, `agenttest-submit --repeat K` runs it embedded (SQLite,
`--parallel`), and the benchmark reads:

- calls: counted at the agent, and summed from the records' `usage_by_role`, with
  their ratio to K=1's (K repeats should cost K times the calls, and the cost K times);
- time per turn: the run's own duration (its report's `duration_s`: from its first
  conversation to its last, start-up and report printing left out) over the turns it
  played, as a ratio to K=1's; and the runner's CPU per turn (the whole process's user
  and system time, less a one-case run's, which is its start-up), as a ratio to K=1's;
- the same two against K*cases distinct cases played once (as many conversations as
  K repeats of the suite): what a repetition costs next to a conversation of its own.

Every figure is a ratio to what was measured in the same run; best of `--rounds`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from benchmarks.common import BIN, ROOT, compile_bytecode
from benchmarks.fixed_agent import completion

USAGE = {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}
VERDICT = json.dumps({"passed": True, "score": 1.0, "reason": "fine"})


def serve(latency: float) -> None:
    """The counting agent (this process, until killed): prints its base URL first."""
    counts: Counter[str] = Counter()
    replies = {"bench": completion("Noted, thank you.", USAGE), "judge": completion(VERDICT, USAGE)}

    async def complete(request: web.Request) -> web.Response:
        model = str((await request.json()).get("model"))
        counts[model] += 1
        await asyncio.sleep(latency)
        return web.Response(
            body=replies.get(model, replies["bench"]), content_type="application/json"
        )

    async def counted(request: web.Request) -> web.Response:
        found = dict(counts)
        if request.query.get("reset"):
            counts.clear()
        return web.json_response(found)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/counts", counted)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None, backlog=1024)


@contextmanager
def counting_agent(latency_ms: float) -> Iterator[str]:
    command = [sys.executable, "-m", "benchmarks.repeat_cost", "--serve"]
    proc = subprocess.Popen(
        [*command, "--latency-ms", str(latency_ms)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


def take_counts(agent: str) -> Counter[str]:
    with urllib.request.urlopen(f"{agent}/counts?reset=1", timeout=10) as reply:
        return Counter(json.loads(reply.read()))


def write_suite(directory: Path, agent: str, cases: int) -> tuple[Path, Path]:
    """(agenttest.yaml, the cases), in `directory`."""
    config = directory / "agenttest.yaml"
    entry = {"base_url": f"{agent}/v1", "timeout": 30, "max_retries": 0}
    config.write_text(
        json.dumps(
            {
                "agents": {
                    name: {
                        **entry,
                        "model": name,
                        "pricing": {"prompt_per_million": 2.0, "completion_per_million": 8.0},
                    }
                    for name in ("bench", "judge")
                }
            }
        )
    )
    judged = {"type": "agent", "use": "agents:judge", "options": {"metadata": {"criteria": "ok"}}}
    path = directory / f"cases-{cases}.jsonl"
    with path.open("w") as handle:
        for i in range(cases):
            turns = [
                {
                    "input": f"message {i}.{n}",
                    "assertions": [{"type": "contains", "value": "Noted"}, judged],
                }
                for n in (1, 2)
            ]
            handle.write(json.dumps({"id": f"c{i:04d}", "turns": turns}) + "\n")
    return config, path


@dataclass
class Measured:
    repeats: int
    conversations: int
    turns: int
    duration_s: float
    cpu_s: float
    agent_calls: Counter[str]
    usage_calls: Counter[str]
    usage_cost: float


def run_once(
    directory: Path,
    agent: str,
    cases: Path,
    config: Path,
    repeats: int,
    parallel: int,
    only: str | None,
) -> Measured:
    home = directory / f"home-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env["AGENTTEST_HOME"] = str(home)
    out = home / "out.jsonl"
    home.mkdir()
    command = [
        str(BIN / "agenttest-submit"),
        "-i",
        str(cases),
        "-n",
        "bench",
        "--config",
        str(config),
    ]
    command += ["--repeat", str(repeats), "--parallel", str(parallel), "-o", str(out)]
    if only:
        command += ["--id", only]
    take_counts(agent)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, rusage = os.wait4(proc.pid, 0)
    assert proc.stderr is not None
    errors = proc.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(
            f"agenttest-submit exited {os.waitstatus_to_exitcode(status)}: {errors[-2000:]}"
        )
    counted = take_counts(agent)
    report = subprocess.run(
        [str(BIN / "agenttest-submit"), "report", "last", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
    )
    if report.returncode != 0:
        raise SystemExit(f"report exited {report.returncode}: {report.stderr[-2000:]}")
    summary = json.loads(report.stdout)["summary"]
    usage: Counter[str] = Counter()
    cost = 0.0
    conversations = 0
    for line in out.read_text().splitlines():
        conversations += 1
        for role, used in (json.loads(line).get("usage_by_role") or {}).items():
            usage[role] += used["calls"]
            cost += used["cost"]
    return Measured(
        repeats,
        conversations,
        summary["total_turns"],
        summary["duration_s"],
        rusage.ru_utime + rusage.ru_stime,
        counted,
        usage,
        cost,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 5, 10])
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--parallel", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="runs per K; the best counts")
    args = parser.parse_args()
    if args.serve:
        serve(args.latency_ms / 1000)
        return
    if args.repeats[0] != 1:
        raise SystemExit("the first --repeats value is the floor: give 1 first")
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmpdir, counting_agent(args.latency_ms) as agent:
        tmp = Path(tmpdir)
        config, cases = write_suite(tmp, agent, args.cases)
        # Start-up: a run of one case, whose CPU is what every run pays before its turns.
        floor = min(
            (
                run_once(tmp, agent, cases, config, 1, args.parallel, "c0000")
                for _ in range(args.rounds)
            ),
            key=lambda m: m.cpu_s,
        )
        print(
            f"--repeat K: {args.cases} cases of 2 judged turns (2 target + 2 judge calls each), "
            f"agent {args.latency_ms:g} ms, --parallel {args.parallel}, embedded, best of "
            f"{args.rounds}; start-up (a one-case run) {floor.cpu_s:.2f} s CPU"
        )
        print(
            "   K  conversations  turns   target calls (agent/records)"
            "   judge calls (agent/records)   calls ×   cost ×   time/turn ×   CPU/turn ×"
            "   vs distinct: time/turn ×   CPU/turn ×"
        )
        base: Measured | None = None
        for repeats in args.repeats:
            rounds = [
                run_once(tmp, agent, cases, config, repeats, args.parallel, None)
                for _ in range(args.rounds)
            ]
            best, per_turn, cpu_per_turn = _best(rounds, floor)
            if base is None:
                base = best
                base_per_turn, base_cpu = per_turn, cpu_per_turn
            calls = sum(best.agent_calls.values()) / sum(base.agent_calls.values())
            line = (
                f"  {repeats:>2}  {best.conversations:>13,}  {best.turns:>5,}"
                f"   {best.agent_calls['bench']:>13,} / {best.usage_calls['target']:<13,}"
                f"   {best.agent_calls['judge']:>12,} / {best.usage_calls['judge']:<12,}"
                f"   {calls:>7.2f}   {best.usage_cost / base.usage_cost:>6.2f}"
                f"   {per_turn / base_per_turn:>11.2f}   {cpu_per_turn / base_cpu:>10.2f}"
            )
            if repeats > 1:
                # As many conversations, each a case of its own, played once.
                _, distinct = write_suite(tmp, agent, args.cases * repeats)
                alone = [
                    run_once(tmp, agent, distinct, config, 1, args.parallel, None)
                    for _ in range(args.rounds)
                ]
                _, alone_per_turn, alone_cpu = _best(alone, floor)
                line += f"   {per_turn / alone_per_turn:>12.2f}   {cpu_per_turn / alone_cpu:>11.2f}"
            print(line)


def _best(rounds: list[Measured], floor: Measured) -> tuple[Measured, float, float]:
    """The fastest round, its time per turn, and the least CPU per turn past start-up."""
    best = min(rounds, key=lambda m: m.duration_s / m.turns)
    cpu = min(rounds, key=lambda m: m.cpu_s)
    return best, best.duration_s / best.turns, (cpu.cpu_s - floor.cpu_s) / (cpu.turns - floor.turns)


if __name__ == "__main__":
    main()
