"""The run-wide limits keep the same promise embedded and on a fleet.

--parallel caps the conversations in flight, --fail-fast starts nothing after the first
failure (and the summary says how many were not run), --deadline cancels the turns still
running: each test runs the same submission on the embedded default and on a one-worker
fleet (marked `fleet`), against a scripted agent over HTTP that notes when each request
arrived. And a submitter waiting on a fleet where no worker listens says so.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, fleet_on, lines_read, wait_until
from places import PLACES, Place
from scripted_agent import Body, Reply, ScriptedAgent, say

# Threads of the fleet's one worker: more than any cap the tests set.
WORKER_THREADS = 4


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


class Arrivals:
    """A scripted model's rule that answers after `delay` and notes each arrival."""

    def __init__(self, reply: str, delay: float = 0.0) -> None:
        self.reply, self.delay = reply, delay
        self.times: list[float] = []
        self.cases: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, body: Body) -> Reply:
        first = next(m for m in body["messages"] if m["role"] == "user")
        with self._lock:
            self.times.append(time.monotonic())
            self.cases.append(str(first["content"]).split("#")[-1])
        return say(self.reply, delay=self.delay)

    def most_at_once(self) -> int:
        """The most requests in flight at one moment (each is answered after `delay`)."""
        return max(
            (sum(1 for s in self.times if s <= t < s + self.delay) for t in self.times),
            default=0,
        )


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest) -> Place:
    return Place(request.param, request, worker="limits", threads=WORKER_THREADS)


def _project(tmp_path: Path, agent: ScriptedAgent, **models: dict[str, Any]) -> Path:
    agents = {
        name: agent.entry(name, max_retries=0, timeout=30, **settings)
        for name, settings in models.items()
    }
    path = tmp_path / "agenttest.yaml"
    path.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return path


def _cases(tmp_path: Path, cases: list[dict[str, Any]]) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def _greeting(case_id: str, agent: str | None = None, expect: str = "Hello") -> dict[str, Any]:
    case: dict[str, Any] = {
        "id": case_id,
        "input": f"Hi #{case_id}",
        "assertions": [{"type": "contains", "value": expect}],
    }
    if agent is not None:
        case["agent"] = agent
    return case


def _run(cases: Path, target: str, config: Path, out: Path | None = None) -> list[str]:
    """The arguments that run `cases` against `target` (writing the records to `out`)."""
    written = ["-o", str(out)] if out is not None else []
    return ["-i", str(cases), "-n", target, "--config", str(config), *written]


def _records(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


# -- --parallel ---------------------------------------------------------------------------


def test_parallel_caps_the_conversations_in_flight(place: Place, tmp_path: Path) -> None:
    """--parallel 2: never more than two conversations at once, though the fleet's worker
    could take four; each one that ends starts the next."""
    # Embedded, both conversations start within milliseconds: a shorter turn does.
    rule = Arrivals("Hello there.", delay=0.15 if place.where == "embedded" else 0.25)
    with ScriptedAgent() as agent:
        agent.script("slow", rule)
        config = _project(tmp_path, agent, slow={})
        cases = _cases(tmp_path, [_greeting(f"P{i}") for i in range(4)])
        out = tmp_path / "out.jsonl"
        code, _, err = place.submit([*_run(cases, "slow", config, out), "--parallel", "2"])
    assert code == 0, err
    assert [r["status"] for r in _records(out).values()] == ["passed"] * 4
    assert len(rule.times) == 4
    assert rule.most_at_once() == 2, rule.times


# -- --fail-fast --------------------------------------------------------------------------


def test_fail_fast_starts_nothing_after_the_first_failure(place: Place, tmp_path: Path) -> None:
    """F1 fails at once while S1 is still talking to a slow agent: S1 finishes its turn,
    S2..S4 never start, and the summary says that 3 were not run, and why."""
    # S1's turn outlasts F1's by far either way; a fleet takes longer to start both.
    slow = Arrivals("Hello there.", delay=0.4 if place.where == "embedded" else 0.8)
    with ScriptedAgent() as agent:
        agent.script("slow", slow)
        agent.script("fast", lambda _: say("Goodbye."))
        config = _project(tmp_path, agent, slow={}, fast={})
        cases = [_greeting("F1", agent="fast"), *(_greeting(f"S{i}") for i in range(1, 5))]
        out = tmp_path / "out.jsonl"
        code, stdout, err = place.submit(
            [*_run(_cases(tmp_path, cases), "slow", config, out), "--parallel", "2", "--fail-fast"]
        )
    assert code == 1, err
    records = _records(out)
    assert records["F1"]["status"] == "failed"
    # S1 was in flight when F1 failed (on a busy machine its turn may not have reached
    # the agent yet, and then it is not run either); nothing started after it.
    assert slow.cases in (["S1"], []), slow.cases
    not_run = ["S2", "S3", "S4"] if slow.cases else ["S1", "S2", "S3", "S4"]
    for case in not_run:
        assert records[case]["status"] == "skipped"
        assert records[case]["total_turns"] == 0
    said = f"  Not run: {len(not_run)} (--fail-fast stopped the run after F1 failed)"
    assert said in stdout.splitlines(), stdout


# -- --deadline ---------------------------------------------------------------------------


def test_deadline_cancels_the_turns_still_running(place: Place, tmp_path: Path) -> None:
    """--deadline (2 s embedded, 4 s on a fleet, which takes longer to start both turns;
    both leave a loaded machine time to start them) with 60 s turns: the run ends at its
    deadline, not when the turns would have ended; each case fails with the deadline as
    its reason."""
    deadline = 2.0 if place.where == "embedded" else 4.0
    rule = Arrivals("Hello there.", delay=60.0)
    with ScriptedAgent() as agent:
        agent.script("slow", rule)
        config = _project(tmp_path, agent, slow={})
        cases = _cases(tmp_path, [_greeting(f"D{i}") for i in range(2)])
        code, stdout, err = place.submit(
            [*_run(cases, "slow", config), "--deadline", f"{deadline}s", "--format", "json"]
        )
        assert code == 1, err
        assert len(rule.times) == 2  # both turns were running when the deadline came
    report = json.loads(stdout)
    # Well short of the turns' 60 s: the deadline ended the run.
    assert report["summary"]["duration_s"] < deadline + 15.0, report["summary"]
    for record in report["results"]:
        assert record["status"] == "failed"
        assert "deadline" in record["error"], record


# -- --wait without workers ---------------------------------------------------------------


@pytest.mark.fleet
def test_waiting_with_no_worker_says_so_and_keeps_waiting(fleet: Fleet, tmp_path: Path) -> None:
    """Nobody consumes the queue: within a few seconds the submitter says so on stderr and
    how to start a worker, and goes on waiting; once one starts, the run finishes."""
    with ScriptedAgent() as agent:
        agent.script("target", lambda _: say("Hello there."))
        config = _project(tmp_path, agent, target={})
        submitter = fleet.submit_background(
            _run(_cases(tmp_path, [_greeting("W1")]), "target", config)
        )
        said, _ = lines_read(submitter.stderr)
        warning = wait_until(
            lambda: next((line for line in said if "no worker" in line), None),
            10,
            "the submitter to say that no worker consumes the queue",
        )
        assert "no worker is consuming `agenttest`" in warning, warning
        assert "celery -A agenttest_worker worker" in "".join(said)
        assert submitter.poll() is None  # still waiting
        fleet.start("late", concurrency=1)
        assert submitter.wait(30) == 0, "".join(said)
