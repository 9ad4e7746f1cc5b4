"""More faults on a real fleet: the database restarting mid-run, a worker told to stop
(SIGTERM, as in a deploy) mid-turn, an agent that hangs, an agent answering 429 for a
while (AGENTTEST_TEST_429_SECONDS, default 30, the issue's number).

Each run completes with exactly one `turns` row per (case, turn). (A worker SIGKILLed
mid-turn and the broker restarting: test_faults.py.)
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_kit import HANG, Fault, FaultAgent, PostgresServer, Request, openai_agent, write_config
from fleet import (
    Fleet,
    WatchingAgent,
    case_rows,
    expense_case,
    fleet_on,
    greeting_case,
    run_id_of,
    turn_rows,
    wait_until,
    write_cases,
    write_project,
)

from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import RECONNECT_DELAYS, get_engine

# Every test here runs Celery workers (tests/fleet.py) against restarting services.
pytestmark = pytest.mark.fleet

RECONNECT_SECONDS = sum(RECONNECT_DELAYS)
WINDOW_429 = float(os.environ.get("AGENTTEST_TEST_429_SECONDS", "30"))


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _all_turns_once(url: str, run_id: str, turns: dict[str, int]) -> None:
    assert turn_rows(url, run_id) == {
        (case, number): 1 for case, count in turns.items() for number in range(1, count + 1)
    }


# -- the database restarts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("down_for", "mode", "stall"),
    [(1.0, "fast", 60), (17.0, "immediate", 3)],
    ids=["restart", "crash-past-retries"],
)
def test_a_database_restart_mid_run_loses_nothing(
    redis_db: str, demo_url: str, tmp_path: Path, down_for: float, mode: str, stall: int
) -> None:
    """Postgres (a private cluster) goes down with turns in flight and turns queued.

    A restart of a few seconds is ridden out by the hot path's reconnecting retries: no
    turn fails, none is re-enqueued, the agent sees each turn once. An outage longer
    than those retries (~16 s) fails the turns that were running; the stall sweeper
    re-enqueues their conversations from the store once it is back. Either way every
    conversation ends with each turn recorded once, and the submitter, which waited
    through the outage, prints the report.

    In the long outage the visibility timeout is longer than the outage: with the
    fleet's 5 s, Redis would also hand the stuck turns to other threads, and whichever
    of those copies or the sweeper reached the database first would finish the run (a
    race this test is not about; a redelivered turn is tested in test_faults.py).
    """
    with PostgresServer(tmp_path / "pg") as pg, WatchingAgent(demo_url, delay=0.4) as agent:
        url = pg.create_database("agenttest")
        fleets = fleet_on(redis_db, url, demo_url, tmp_path)
        fleet = next(fleets)
        fleet.env["AGENTTEST_STALL_SECONDS"] = str(stall)
        if down_for >= RECONNECT_SECONDS:
            fleet.env["AGENTTEST_VISIBILITY_TIMEOUT"] = "60"
        try:
            config = write_project(tmp_path, agent.base_url)
            ids = [f"P{i}" for i in range(8)]
            cases = write_cases(tmp_path, [expense_case(c) for c in ids])
            workers = [fleet.start(n, concurrency=2, wait=False) for n in ("a", "b")]
            submitter = fleet.submit_background(
                ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
            )
            for worker in workers:
                worker.wait_ready()
            # Turns in flight on both workers, some conversations past turn 1.
            wait_until(lambda: len(agent.seen()) >= 6, 30, "turns in flight")
            before = len(agent.seen())
            pg.restart(down_for=down_for, mode=mode)
            get_engine(url).dispose()  # this process's pooled connections died too

            stdout, stderr = submitter.communicate(timeout=120)
            logs = fleet.logs()
            assert submitter.returncode == 0, f"{stderr}\n{logs[-5000:]}"
            run_id = run_id_of(stderr)
            assert "Passed:  8" in stdout, stdout
            assert "the database is unreachable" in stderr and "the database is back" in stderr
            _all_turns_once(url, run_id, dict.fromkeys(ids, 3))
            assert [(p, s) for _, p, s in case_rows(url, run_id)] == [("done", "passed")] * 8
            run = runs.get_run(url, run_id)
            assert run is not None and (run.status, run.total_turns) == ("done", 24)
            assert len(agent.seen()) > before  # the run went on after the restart
            calls = Counter((s.case, s.turn) for s in agent.seen())
            if down_for < RECONNECT_SECONDS:
                assert "raised unexpected" not in logs, logs
                assert "re-enqueued" not in logs + stderr
                # Nothing ran twice (turn 2 calls the agent again with the tool's result).
                assert calls == {(c, t): 2 if t == 2 else 1 for c in ids for t in (1, 2, 3)}
            else:
                assert "raised unexpected: OperationalError" in logs
                assert "re-enqueued" in logs + stderr
        finally:
            get_engine(url).dispose()
            next(fleets, None)  # closes the fleet


# -- a worker told to stop mid-turn (a deploy) ------------------------------------------------


def test_a_worker_stopped_mid_turn_finishes_it_and_another_takes_the_rest(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """SIGTERM is Celery's warm shutdown: the worker stops taking messages, finishes the
    turns it is running (each saved once, its next turn published), and exits; what it
    had not started goes back to the queue and a second worker runs it."""
    with WatchingAgent(demo_url, delay=2.0) as agent:
        config = write_project(tmp_path, agent.base_url)
        ids = ["D1", "D2", "D3", "D4"]
        cases = write_cases(tmp_path, [expense_case(c) for c in ids])
        old = fleet.start("old", concurrency=2, wait=False)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        old.wait_ready()
        first = agent.wait_for(lambda s: s.worker == "old")  # a turn is in flight
        time.sleep(0.3)  # (and the second thread's, most likely)
        in_flight = {(s.case, s.turn) for s in agent.seen() if s.worker == "old"}
        old.stop(timeout=30)  # SIGTERM; returns when the worker has exited
        exited = time.monotonic()
        assert old.process.returncode == 0, old.log()
        agent.delay = 0.2
        fleet.start("new", concurrency=2)
        fleet.wait_done(run_id, timeout=60)

    _all_turns_once(fleet.database_url, run_id, dict.fromkeys(ids, 3))
    assert [(p, s) for _, p, s in case_rows(fleet.database_url, run_id)] == [("done", "passed")] * 4
    # The old worker waited for its turns (the agent answers 2 s after they arrive) and
    # finished them before exiting.
    assert exited >= first.at + 2.0
    log = old.log()
    assert "Warm shutdown" in log, log
    finished = re.findall(r"agenttest\.turn\[[^\]]+\] succeeded in [\d.]+s: '(\w+) turn (\d)", log)
    assert {(c, int(t)) for c, t in finished} == in_flight, log
    # Each turn it was running reached the agent once: nobody ran it again.
    for case, number in in_flight:
        assert [s.worker for s in agent.seen(case) if s.turn == number][:1] == ["old"]
        assert all(s.worker == "old" for s in agent.seen(case) if s.turn == number)
    # The rest of the run (at least the next turns of those conversations) ran on "new".
    assert {s.worker for s in agent.seen() if (s.case, s.turn) not in in_flight} == {"new"}


# -- an agent that hangs --------------------------------------------------------------------------


def test_an_agent_that_hangs_fails_its_turns_and_the_run_completes(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """The agent never answers some requests. The agent's `timeout` fails the turn after
    its retries; `--timeout` (per case) cuts a slower agent short; other conversations
    are not held up, and the run completes with every turn recorded once."""

    def hang(request: Request) -> Fault | None:
        hangs = request.case in ("H1", "H2") or (request.case, request.turn) == ("M1", 2)
        return HANG if hangs else None

    with FaultAgent(demo_url) as agent:
        agent.rule = hang
        config = write_config(
            tmp_path,
            {
                "hang.short": openai_agent(
                    agent.base_url, timeout="1s", max_retries=1, base_delay="100ms"
                ),
                "hang.long": openai_agent(agent.base_url, timeout="30s", max_retries=0),
            },
        )
        cases = [
            {**greeting_case("H1"), "agent": "hang.short"},
            {**greeting_case("H2"), "agent": "hang.long"},
            {**expense_case("M1"), "agent": "hang.short"},
            *(greeting_case(f"OK{i}") for i in range(4)),
        ]
        fleet.start("w", concurrency=4)
        out = tmp_path / "results.jsonl"
        done = fleet.submit(
            [
                "-i",
                str(write_cases(tmp_path, cases)),
                "-n",
                "hang.short",
                "--config",
                str(config),
                "--timeout",
                "3s",
                "-o",
                str(out),
            ]
        )
        assert done.returncode == 1, done.stderr  # failed cases, not an error
        run_id = run_id_of(done.stderr)

    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert {c: r["status"] for c, r in records.items()} == {
        "H1": "failed",
        "H2": "failed",
        "M1": "failed",
        **{f"OK{i}": "passed" for i in range(4)},
    }
    assert records["H1"]["turns"][0]["error"] == "timeout after 1s (after 2 attempts)"
    assert records["H2"]["turns"][0]["error"] == "timeout after 3s (the case's time limit)"
    m1 = records["M1"]["turns"]
    assert [t["status"] for t in m1] == ["passed", "failed"]  # no reply: the case ends
    assert m1[1]["error"] == "timeout after 1s (after 2 attempts)"
    # Two attempts for the short timeout, one (cut short by the case's) for the long one.
    assert [len(agent.seen("H1")), len(agent.seen("H2"))] == [2, 1]
    assert len([r for r in agent.seen("M1") if r.turn == 2]) == 2
    _all_turns_once(
        fleet.database_url,
        run_id,
        {"H1": 1, "H2": 1, "M1": 2, **{f"OK{i}": 1 for i in range(4)}},
    )


# -- an agent answering 429 for a while ----------------------------------------------------------


def _bursts(times: list[float], gap: float = 0.5) -> list[int]:
    """Sizes of the groups of arrivals separated by more than `gap` seconds."""
    sizes: list[int] = []
    last = None
    for t in sorted(times):
        if last is None or t - last > gap:
            sizes.append(0)
        sizes[-1] += 1
        last = t
    return sizes


def test_an_agent_answering_429_for_a_while_and_the_fleet_backing_off(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """The agent answers 429 with Retry-After for WINDOW_429 seconds, then recovers.

    Three registry entries for it, four conversations each, all in flight at once on two
    workers: `solo` (no rate_limit: the limit is learned from the agent, and a 429's
    Retry-After pauses every caller of the agent too), `shared`
    (`rate_limit: {}`: a 429 pauses every caller of the agent, fleet-wide) and `probe`
    (`rate_limit: {concurrency: 1}`: one call at a time, so after each pause a single
    call probes the agent). Every conversation passes once the agent recovers, each turn
    recorded once. During the window the agent sees a bounded number of requests: at
    most one per waiting conversation per Retry-After; under `shared` they come only at
    the ends of the common pauses, never inside one; under `probe`, one per pause.
    """
    window = WINDOW_429
    retry_after = float(max(1, round(window / 15)))  # ~15 pauses, within max_retries
    callers = 4
    names = ("solo", "shared", "probe")
    limits: dict[str, dict[str, int] | None] = {
        "solo": None,
        "shared": {},
        "probe": {"concurrency": 1},
    }
    with FaultAgent(demo_url) as agent:
        entries = {}
        for name in names:
            entries[name] = openai_agent(
                agent.base_url, max_retries=20, base_delay="100ms", headers={"X-Entry": name}
            )
            if limits[name] is not None:
                entries[name]["rate_limit"] = limits[name]
        config = write_config(tmp_path, entries)
        cases = [
            {**greeting_case(f"{name}-{i}"), "agent": name}
            for i in range(callers)
            for name in names
        ]
        # Turns last as long as the window: the broker must not hand them out again
        # meanwhile (the visibility timeout stays above the longest turn).
        visibility = str(int(window) + 60)
        workers = [
            fleet.start(n, concurrency=2 * callers, wait=False, visibility_timeout=visibility)
            for n in ("a", "b")
        ]
        for worker in workers:
            worker.wait_ready()
        _, end = agent.too_many_requests(window, retry_after)
        done = fleet.submit(
            ["-i", str(write_cases(tmp_path, cases)), "-n", "solo", "--config", str(config)],
            timeout=window + 60,
        )
        assert done.returncode == 0, done.stderr
        run_id = run_id_of(done.stderr)

    assert f"Passed:  {3 * callers}" in done.stdout, done.stdout
    _all_turns_once(fleet.database_url, run_id, {c["id"]: 1 for c in cases})
    during = {
        name: sorted(r.at for r in agent.seen() if r.at < end and r.headers["X-Entry"] == name)
        for name in names
    }
    pauses = window / retry_after
    counts = {name: len(times) for name, times in during.items()}
    report = f"requests in the {window:g} s window (Retry-After {retry_after:g}): {counts}"
    print(report)
    # Bounded: a waiting conversation calls again only after each Retry-After.
    for name in ("solo", "shared"):
        assert counts[name] <= callers * (pauses + 1), report
    # `shared`: the fleet pauses together; the calls come in bursts, a Retry-After apart.
    bursts = _bursts(during["shared"], gap=retry_after / 2)
    assert max(bursts) <= callers and len(bursts) <= pauses + 1, (report, bursts)
    # `solo`, with no rate_limit, learns from the 429s: its calls back off together too.
    solo_bursts = _bursts(during["solo"], gap=retry_after / 2)
    assert max(solo_bursts) <= callers and len(solo_bursts) <= pauses + 1, (report, solo_bursts)
    # `probe`: one call per pause.
    assert counts["probe"] <= pauses + 2, report
