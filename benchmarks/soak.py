"""Soak: a fleet running mixed cases for a long time while things break, watched for leaks.

    python -m benchmarks.soak --minutes 20            # the default: 20 minutes
    python -m benchmarks.soak --minutes 2 --fault-every 15

Everything is real and private to the run: a `redis-server` and a PostgreSQL cluster of
its own (initdb in a temporary directory, so both can be restarted), the demo agents
behind a proxy that adds latency and injects faults, itself behind an https front that
counts the calls (benchmarks/fixed_agent.py `--forward`, its self-signed certificate
trusted through SSL_CERT_FILE: benchmarks/common.py), `celery -A agenttest_worker worker`
processes, and `agenttest-submit --no-wait` submitting runs of mixed cases (one-turn,
three static turns with a tool mock, simulator-driven, LLM-judged), keeping --inflight
runs going. One worker ("steady") lives through the whole soak, so its memory over
time says whether a worker leaks; the other ("churn-N") is the one faults kill.

Every --fault-every seconds the next fault of this cycle is injected:
  kill      SIGKILL the churn worker mid-turn, start a new one
  429       the target agent answers 429 (Retry-After 2) for 10 s
  redis     restart Redis, which keeps nothing: every queued message is lost
  outage    the target agent answers 503 for 8 s
  deploy    SIGTERM the churn worker (warm shutdown) and start a new one alongside
  postgres  restart PostgreSQL (fast shutdown, 2 s down)

Every minute it prints turns/s, turns recorded, the queue's length, each worker's RSS
and the faults of that minute. At the end (submissions stop, the runs drain), it checks
every run in the database: lost turns (a case not finished, or fewer turn rows than its
record says it ran) and doubled turns (more than one row per (case, turn), rows beyond
the record's turns, a case counted twice in its run) must both be zero; and it prints
the steady worker's memory growth. It also counts the calls each agent answered (at the
https front, by model) against the calls the cases' records say they needed (their
`usage_by_role`: a turn with a tool call needs two), redeliveries included; only a call
under way when its worker was SIGKILLed may be made again (at most `--concurrency` a
kill). Exit status 1 if anything was lost or doubled, or a call wasted beyond that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fault_kit import Fault, FaultAgent, PostgresServer, openai_agent, write_config  # noqa: E402
from fleet import WORKER_ENV, RedisServer, _die_with_parent, expense_case, greeting_case  # noqa: E402

from agenttest_worker.demo.demo_server import DemoServer  # noqa: E402
from benchmarks.common import BIN, AgentUrl, forwarding_agent, queued_messages  # noqa: E402

FAULTS = ("kill", "429", "redis", "outage", "deploy", "postgres")
_RUN_ID = re.compile(r"run (\S+): \d+ case\(s\) enqueued")


def say(message: str) -> None:
    print(message, flush=True)


# -- processes ------------------------------------------------------------------------------


class SoakWorker:
    """A `celery worker` process (the default pool), logging warnings to its own file."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path, args: list[str]) -> None:
        self.name = name
        self.log_path = workdir / f"worker-{name}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "agenttest_worker",
                "worker",
                "--loglevel=WARNING",
                "-n",
                f"{name}@%h",
                *args,
                "--without-mingle",
                "--without-gossip",
            ],
            env={**env, WORKER_ENV: name},
            cwd=workdir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.stopping_since: float | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_mb(self) -> float | None:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(found.group(1)) / 1024 if found else None

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._log.close()

    def terminate(self) -> None:
        """SIGTERM: warm shutdown (the turns in flight finish); `reap` waits for it."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        self.stopping_since = time.monotonic()

    def reap(self, grace: float = 90.0) -> bool:
        """True once a terminated worker has exited (killed after `grace` seconds)."""
        if self.alive():
            if self.stopping_since is None or time.monotonic() - self.stopping_since < grace:
                return False
            self.process.kill()
        self.process.wait(10)
        self._log.close()
        return True


# -- the workload ---------------------------------------------------------------------------


def mixed_cases(count: int) -> list[dict[str, Any]]:
    """A quarter each: one turn, three static turns, simulator-driven, judged."""
    cases: list[dict[str, Any]] = []
    for i in range(count):
        case_id = f"C{i:04d}"
        kind = i % 4
        if kind == 0:
            cases.append(greeting_case(case_id))
        elif kind == 1:
            cases.append(expense_case(case_id))
        elif kind == 2:
            cases.append(
                {
                    "id": case_id,
                    "input": f"Help me file an expense [case {case_id}]",
                    "tool_mocks": {"create_expense": {"id": f"EXP-{case_id}", "status": "draft"}},
                    "simulator": {
                        "use": "agents:soak.sim",
                        "metadata": {
                            "persona": "New employee",
                            "goal": "Submit a client dinner expense",
                            "max_turns": 6,
                        },
                    },
                    "final_assertions": [{"type": "contains", "value": "submitted"}],
                }
            )
        else:
            judged = greeting_case(case_id)
            judged["assertions"].append(
                {
                    "type": "agent",
                    "options": {"metadata": {"criteria": 'The reply must mention "help you"'}},
                }
            )
            cases.append(judged)
    return cases


@dataclass
class Faults:
    """What the agent proxy does to the target's requests, by time window."""

    until: float = 0.0
    fault: Fault | None = None

    def rule(self, request: Any) -> Fault | None:
        if self.fault is not None and request.model == "expense" and time.monotonic() < self.until:
            return self.fault
        return None

    def set(self, fault: Fault, seconds: float) -> None:
        self.fault, self.until = fault, time.monotonic() + seconds


@dataclass
class Soak:
    args: argparse.Namespace
    workdir: Path
    env: dict[str, str]
    redis_server: RedisServer
    pg: PostgresServer
    database_url: str
    faults: Faults
    cases_path: Path
    config_path: Path
    steady: SoakWorker | None = None
    churn: SoakWorker | None = None
    stopping: list[SoakWorker] = field(default_factory=list)
    churn_count: int = 0
    steady_count: int = 1
    unexpected_exits: int = 0
    runs: list[str] = field(default_factory=list)
    failed_submissions: int = 0
    submit_paused_until: float = 0.0
    injected: list[tuple[float, str]] = field(default_factory=list)
    minute_faults: list[str] = field(default_factory=list)
    rss_steady: list[float] = field(default_factory=list)

    # -- workers ----------------------------------------------------------------------------

    @property
    def worker_args(self) -> list[str]:
        pool = ["--pool", self.args.pool] if self.args.pool else []
        return ["--concurrency", str(self.args.concurrency), *pool]

    def start_workers(self) -> None:
        self.steady = SoakWorker("steady", self.env, self.workdir, self.worker_args)
        self.new_churn()

    def new_churn(self) -> None:
        self.churn_count += 1
        self.churn = SoakWorker(
            f"churn-{self.churn_count}", self.env, self.workdir, self.worker_args
        )

    def check_workers(self) -> None:
        """A worker that exited without being told to is a finding: say so, replace it."""
        for role in ("steady", "churn"):
            worker: SoakWorker | None = getattr(self, role)
            if worker is None or worker.alive():
                continue
            tail = worker.log_path.read_text(errors="replace").strip().splitlines()[-3:]
            say(
                f"      worker {worker.name} exited by itself ({worker.process.returncode}): {tail}"
            )
            self.unexpected_exits += 1
            worker.kill()
            if role == "steady":
                self.steady_count += 1
                self.steady = SoakWorker(
                    f"steady-{self.steady_count}", self.env, self.workdir, self.worker_args
                )
                self.rss_steady = []  # memory is followed for one process
            else:
                self.new_churn()

    def workers(self) -> list[SoakWorker]:
        return [w for w in (self.steady, self.churn, *self.stopping) if w is not None]

    def close(self) -> None:
        for worker in self.workers():
            with contextlib.suppress(Exception):
                worker.kill()

    # -- submitting -------------------------------------------------------------------------

    def submit(self) -> None:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "agenttest_submit.cli",
                "-i",
                str(self.cases_path),
                "-n",
                "soak.expense",
                "--config",
                str(self.config_path),
                "--no-wait",
            ],
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        found = _RUN_ID.search(done.stderr)
        if found:
            self.runs.append(found.group(1))
        if done.returncode != 0 or not found:
            self.failed_submissions += 1
            say(
                f"      (a submission failed, exit {done.returncode}: {done.stderr.strip()[-200:]})"
            )

    def unfinished(self) -> int:
        if not self.runs:
            return 0
        with psycopg.connect(self.database_url, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status <> 'done'", (self.runs,)
            ).fetchone()
        return int(row[0]) if row else 0

    # -- faults -----------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        self.injected.append((time.monotonic(), kind))
        self.minute_faults.append(kind)
        if kind == "kill":
            assert self.churn is not None
            self.churn.kill()
            self.new_churn()
        elif kind == "deploy":
            assert self.churn is not None
            self.churn.terminate()
            self.stopping.append(self.churn)
            self.new_churn()
        elif kind == "429":
            self.faults.set(
                Fault(
                    status=429,
                    headers={"Retry-After": "2"},
                    body={"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                ),
                10.0,
            )
        elif kind == "outage":
            self.faults.set(
                Fault(status=503, body={"error": {"message": "overloaded", "type": "server"}}),
                8.0,
            )
        elif kind == "redis":
            self.submit_paused_until = time.monotonic() + 10
            self.redis_server.stop()
            self.redis_server.start()
        elif kind == "postgres":
            self.submit_paused_until = time.monotonic() + 10
            self.pg.restart(down_for=2.0, mode="fast")

    def reap(self) -> None:
        self.stopping = [w for w in self.stopping if not w.reap()]

    # -- watching ---------------------------------------------------------------------------

    def turns_recorded(self) -> int | None:
        try:
            with psycopg.connect(self.database_url, connect_timeout=5) as conn:
                row = conn.execute("SELECT count(*) FROM turns").fetchone()
            return int(row[0]) if row else 0
        except psycopg.OperationalError:
            return None

    def queue_length(self) -> str:
        try:
            client = redis.Redis.from_url(self.redis_server.url, socket_timeout=2)
            return str(queued_messages(client))
        except redis.RedisError:
            return "-"


def _rss(value: float | None) -> str:
    return f"{value:6.1f}" if value is not None else "     -"


# -- the final check ------------------------------------------------------------------------


@dataclass
class Audit:
    runs: int = 0
    runs_done: int = 0
    cases: int = 0
    cases_done: int = 0
    turns: int = 0
    lost: int = 0
    doubled: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def audit(database_url: str, run_ids: list[str]) -> Audit:
    result = Audit(runs=len(run_ids))
    with psycopg.connect(database_url) as conn:
        runs = conn.execute(
            "SELECT id, status, total_cases, finished_cases, total_turns, "
            "passed + failed + skipped FROM runs WHERE id = ANY(%s)",
            (run_ids,),
        ).fetchall()
        rows = {
            (r, c, t): n
            for r, c, t, n in conn.execute(
                "SELECT run_id, case_id, turn, count(*) FROM turns WHERE run_id = ANY(%s) "
                "GROUP BY run_id, case_id, turn",
                (run_ids,),
            )
        }
        cases = conn.execute(
            "SELECT run_id, case_id, phase, status, (result->>'total_turns')::int, "
            "result->>'error' FROM cases WHERE run_id = ANY(%s)",
            (run_ids,),
        ).fetchall()
    if len(runs) != len(run_ids):
        result.problems.append(f"{len(run_ids) - len(runs)} submitted run(s) not in the database")
    per_case: dict[tuple[str, str], list[int]] = {}
    for (run, case, turn), n in rows.items():
        per_case.setdefault((run, case), []).append(turn)
        result.turns += n
        if n > 1:
            result.doubled += n - 1
            result.problems.append(f"{run}/{case} turn {turn}: {n} rows")
    turns_by_run: Counter[str] = Counter()
    for run, case, phase, status, total_turns, error in cases:
        result.cases += 1
        recorded = sorted(per_case.get((run, case), []))
        turns_by_run[run] += len(recorded)
        if phase != "done" or total_turns is None:
            result.lost += 1
            result.problems.append(f"{run}/{case}: never finished (phase {phase})")
            continue
        result.cases_done += 1
        result.statuses[status] += 1
        if error:
            result.errors[re.sub(r"\d+", "N", error)[:90]] += 1
        expected = list(range(1, total_turns + 1))
        missing = len(set(expected) - set(recorded))
        extra = len(set(recorded) - set(expected))
        if missing:
            result.lost += missing
            result.problems.append(f"{run}/{case}: {missing} of {total_turns} turns missing")
        if extra:
            result.doubled += extra
            result.problems.append(f"{run}/{case}: {extra} turn row(s) past its {total_turns}")
    for run, status, total, finished, total_turns, counted in runs:
        if status == "done":
            result.runs_done += 1
        else:
            result.problems.append(f"run {run}: {status}, {finished}/{total} cases finished")
        if finished > total or counted > total:
            result.doubled += max(finished, counted) - total
            result.problems.append(f"run {run}: {finished} cases finished of {total}")
        if total_turns != turns_by_run[run]:
            result.problems.append(
                f"run {run}: counted {total_turns} turns, {turns_by_run[run]} rows"
            )
            if total_turns > turns_by_run[run]:
                result.doubled += total_turns - turns_by_run[run]
    return result


# The model each agent entry asks the demo for, by the role its calls are counted under
# in a case's record (`usage_by_role`).
MODELS = {"target": "expense", "simulator": "user-sim", "judge": "validator"}


def report_calls(soak: Soak, front: AgentUrl) -> bool:
    """Whether the agents answered as many calls as the cases' records say they needed
    (a turn with a tool call needs two), beyond which only the calls under way in a
    SIGKILLed worker may have been made again (at most its concurrency a kill)."""
    needed: dict[str, int] = {}
    with psycopg.connect(soak.database_url) as conn:
        for role, model in MODELS.items():
            row = conn.execute(
                "SELECT coalesce(sum((result->'usage_by_role'->%s->>'calls')::int), 0)"
                " FROM cases WHERE run_id = ANY(%s)",
                (role, soak.runs),
            ).fetchone()
            needed[model] = int(row[0]) if row else 0
    answered = front.answered()
    kills = sum(1 for _, kind in soak.injected if kind == "kill")
    allowed = kills * soak.args.concurrency
    extra = {model: answered.get(model, 0) - needed[model] for model in needed}
    say(
        f"agent calls: {front.calls()} at the https front (faults included); answered, "
        + ", ".join(f"{m} {answered.get(m, 0)} for {needed[m]} needed" for m in needed)
        + f": {sum(extra.values()):+d} (floor: the calls the records count; target: at most "
        f"{allowed} more, the calls under way in the {kills} SIGKILLed worker(s))"
    )
    if min(extra.values()) < 0 or sum(extra.values()) > allowed:
        say(f"FAILED: agent calls beyond what the cases needed: {extra}")
        return False
    return True


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="turns in flight per worker (-c)"
    )
    parser.add_argument(
        "--pool", default=None, help="the workers' --pool (default: agenttest's own, the loop pool)"
    )
    parser.add_argument("--cases", type=int, default=200, help="cases per submitted run")
    parser.add_argument("--inflight", type=int, default=3, help="runs kept going at once")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="the agents' latency")
    parser.add_argument("--stall-seconds", type=float, default=30.0)
    parser.add_argument("--drain-minutes", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="agenttest-soak-"))
    say(
        f"soak: {args.minutes:g} min, a fault every {args.fault_every:g} s ({', '.join(FAULTS)}), "
        f"workers steady + churn at -c {args.concurrency}, runs of {args.cases} mixed "
        f"cases, {args.inflight} in flight, agent latency {args.latency_ms:g} ms"
    )
    say(f"work directory: {workdir}")
    faults = Faults()
    soak: Soak | None = None
    try:
        with (
            RedisServer(workdir / "redis") as redis_server,
            PostgresServer(workdir / "pg") as pg,
            DemoServer(port=0) as demo,
            FaultAgent(demo.base_url, delay=args.latency_ms / 1000, keep=False) as agent,
            forwarding_agent(agent.base_url) as front,
        ):
            agent.rule = faults.rule
            database_url = pg.create_database("agenttest")
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
            env["AGENTTEST_DATABASE_URL"] = database_url
            subprocess.run(
                [str(BIN / "agenttest-submit"), "db", "upgrade"],
                env=env,
                check=True,
                capture_output=True,
            )
            entry = {"timeout": "10s", "max_retries": 6, "base_delay": "500ms"}
            config = write_config(
                workdir,
                {
                    "soak.expense": {
                        **openai_agent(front, "expense", **entry),
                        "tools": ["create_expense"],
                        "rate_limit": {},  # a 429 pauses every caller, fleet-wide
                    },
                    "soak.sim": openai_agent(front, "user-sim", **entry),
                    "soak.judge": openai_agent(front, "validator", **entry),
                },
                defaults={"judge": "soak.judge", "simulator": "soak.sim"},
            )
            cases_path = workdir / "cases.jsonl"
            cases_path.write_text(
                "".join(json.dumps(c) + "\n" for c in mixed_cases(args.cases)), encoding="utf-8"
            )
            env.update(
                {
                    "AGENTTEST_BROKER_URL": redis_server.url,
                    "AGENTTEST_HOME": str(workdir / ".agenttest"),
                    # Above the longest turn (retries through a fault), so that Redis
                    # hands a message out again only when its worker is gone.
                    "AGENTTEST_VISIBILITY_TIMEOUT": "90",
                    "AGENTTEST_RESTORE_INTERVAL": "5",
                    "AGENTTEST_STALL_SECONDS": str(args.stall_seconds),
                    "PYTHONUNBUFFERED": "1",
                }
            )
            soak = Soak(
                args, workdir, env, redis_server, pg, database_url, faults, cases_path, config
            )
            return run(soak, agent, front)
    finally:
        if soak is not None:
            soak.close()
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run(soak: Soak, agent: FaultAgent, front: AgentUrl) -> int:
    args = soak.args
    soak.start_workers()
    started = time.monotonic()
    end = started + args.minutes * 60
    next_fault = started + args.fault_every
    next_report = started + 60
    fault_index = 0
    minute = 0
    last_turns = 0
    say("")
    say(" min   turns/s   turns   queue   rss steady   rss churn   faults")
    draining = False
    drain_end = end + args.drain_minutes * 60

    def report(now: float) -> None:
        nonlocal minute, last_turns
        minute += 1
        turns = soak.turns_recorded()
        rate = "      -" if turns is None else f"{(turns - last_turns) / 60:7.1f}"
        if turns is not None:
            last_turns = turns
        steady = soak.steady.rss_mb() if soak.steady else None
        if steady is not None:
            soak.rss_steady.append(steady)
        churn = soak.churn.rss_mb() if soak.churn else None
        label = ", ".join(soak.minute_faults) or ("(draining)" if draining else "")
        soak.minute_faults = []
        say(
            f"{minute:4d}   {rate}  {last_turns:6d}  {soak.queue_length():>6}"
            f"   {_rss(steady)} MB   {_rss(churn)} MB   {label}"
        )

    while True:
        now = time.monotonic()
        if not draining and now >= end:
            draining = True
        soak.reap()
        soak.check_workers()
        if draining:
            try:
                if soak.unfinished() == 0:
                    break
            except psycopg.OperationalError:
                pass
            if now >= drain_end:
                say("drain timed out: runs still unfinished")
                break
        else:
            if now >= next_fault:
                soak.inject(FAULTS[fault_index % len(FAULTS)])
                fault_index += 1
                next_fault += args.fault_every
            if now >= soak.submit_paused_until:
                try:
                    if soak.unfinished() < args.inflight:
                        soak.submit()
                except psycopg.OperationalError:
                    pass
        if now >= next_report:
            report(now)
            next_report += 60
        time.sleep(0.5)
    elapsed = time.monotonic() - started

    result = audit(soak.database_url, soak.runs)
    logs = "".join(p.read_text(errors="replace") for p in soak.workdir.glob("worker-*.log"))
    say("")
    say(
        f"ran {elapsed / 60:.1f} min ({args.minutes:g} submitting, then draining); "
        f"faults injected: {dict(Counter(kind for _, kind in soak.injected))}"
    )
    say(
        f"runs: {result.runs} submitted, {result.runs_done} done; "
        f"failed submissions: {soak.failed_submissions}"
    )
    say(
        f"cases: {result.cases} ({result.cases_done} finished: {dict(result.statuses)}); "
        f"agent requests: {agent.count}"
    )
    for error, count in result.errors.most_common(5):
        say(f"  {count:5d} x {error}")
    say(
        f"turns recorded: {result.turns}, {result.turns / elapsed:.1f} turns/s overall; "
        f"re-enqueued by the sweeper: {logs.count('re-enqueued')} time(s)"
    )
    say(f"workers that exited by themselves: {soak.unexpected_exits}")
    say(f"lost turns: {result.lost}")
    say(f"doubled turns: {result.doubled}")
    for problem in result.problems[:20]:
        say(f"  {problem}")
    if len(soak.rss_steady) >= 3:
        warm = soak.rss_steady[1]  # after the first minute's warm-up
        last = soak.rss_steady[-1]
        peak = max(soak.rss_steady[1:])
        say(
            f"steady worker RSS: {warm:.1f} MB at minute 2, {last:.1f} MB at the end "
            f"(peak {peak:.1f} MB): growth {last - warm:+.1f} MB ({(last - warm) / warm:+.1%})"
        )
    calls_ok = report_calls(soak, front)
    ok = result.lost == 0 and result.doubled == 0 and result.runs_done == result.runs
    say("OK: nothing lost, nothing doubled" if ok else "FAILED: see the problems above")
    return 0 if ok and calls_ok else 1


if __name__ == "__main__":
    sys.exit(main())
