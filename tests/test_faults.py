"""Faults on a real fleet: a worker SIGKILLed mid-turn, a turn that kills every worker that
runs it, the broker restarting (and forgetting everything) mid-run, a lost aggregation.

In each, the run still completes with exactly one `turns` row per (case, turn): the
broker redelivers a dead worker's message (acks_late + visibility timeout), the store's
turn guard makes every second delivery a no-op, and what the broker lost is re-enqueued
from the store by the sweeper (agenttest_worker.fleet.sweeper, "Recovering lost messages").
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import (
    Fleet,
    RedisServer,
    Seen,
    WatchingAgent,
    Worker,
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

from agenttest_worker.store.sql import recovery, runs
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql.db import upgrade


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _all_turns_once(url: str, run_id: str, turns: dict[str, int]) -> None:
    assert turn_rows(url, run_id) == {
        (case, number): 1 for case, count in turns.items() for number in range(1, count + 1)
    }


@pytest.mark.fleet
def test_a_worker_killed_mid_turn_loses_nothing(
    any_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    fleet = any_fleet
    killed = threading.Event()
    with WatchingAgent(demo_url) as agent:
        # A's calls are answered only once A is dead: it cannot finish a turn, however
        # slowly the machine runs the test.
        agent.hold(lambda s: s.worker == "a", killed)
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case("K1"), expense_case("K2")])
        a = fleet.start("a", concurrency=2, wait=False)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        a.wait_ready()
        agent.wait_for(lambda s: s.worker == "a")  # a turn is in flight on worker A
        a.kill()
        killed.set()
        in_flight = {(s.case, s.turn) for s in agent.seen()}
        fleet.start("b", concurrency=2)
        fleet.wait_done(run_id, timeout=60)

    _all_turns_once(fleet.database_url, run_id, {"K1": 3, "K2": 3})
    assert [(c, p, s) for c, p, s in case_rows(fleet.database_url, run_id)] == [
        ("K1", "done", "passed"),
        ("K2", "done", "passed"),
    ]
    # What A was doing when it died was given back by the broker and run again by B.
    rerun = {(s.case, s.turn) for s in agent.seen() if s.worker == "b"}
    assert in_flight and in_flight <= rerun
    # A finished no turn (it may have expanded the run's start batch before dying).
    assert not re.search(r"agenttest\.turn\[[^\]]+\] succeeded", a.log())


@pytest.mark.fleet
def test_a_turn_that_keeps_killing_its_worker_fails_its_case(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """X1's agent call kills whichever worker makes it; after its first delivery and
    AGENTTEST_MAX_REDELIVERIES more (each run alone in its worker) the case fails with
    the reason, and the rest of the run completes."""
    max_deliveries = 1
    # Replies wait half a second: the kill (sent as the request arrives, from a thread of
    # its own) must land before the worker could get X1's reply and save its turn.
    with WatchingAgent(demo_url, delay=0.5) as agent:
        workers: dict[str, Worker] = {}

        def kill_the_caller(seen: Seen) -> None:
            if seen.case == "X1" and seen.worker in workers:
                workers[seen.worker].kill()

        agent.on_request = kill_the_caller
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(
            tmp_path, [greeting_case("X1"), greeting_case("OK1"), greeting_case("OK2")]
        )
        settings = {"max_redeliveries": str(max_deliveries), "visibility_timeout": "3"}
        # One worker per delivery, started together; each runs one turn at a time, so
        # the kill takes nothing else down with it.
        for name in ("w1", "w2", "w3"):
            workers[name] = fleet.start(name, concurrency=1, wait=False, **settings)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        for worker in workers.values():
            worker.wait_ready()
        fleet.wait_done(run_id, timeout=60)

    # Each delivery but the last ran the turn (and died); the last one called nobody.
    assert len(agent.seen("X1")) == max_deliveries + 1
    assert len({s.worker for s in agent.seen("X1")}) == max_deliveries + 1
    records = {r.id: r for r in results.iter_results(fleet.database_url, run_id)}
    assert {case: r.status for case, r in records.items()} == {
        "X1": "failed",
        "OK1": "passed",
        "OK2": "passed",
    }
    reason = (
        f"turn 1 was delivered {max_deliveries + 2} times without finishing "
        f"(the worker running it died each time, {max_deliveries} of them with this turn "
        "running alone)"
    )
    assert records["X1"].error == reason, records["X1"]
    _all_turns_once(fleet.database_url, run_id, {"OK1": 1, "OK2": 1})
    run = runs.get_run(fleet.database_url, run_id)
    assert run is not None and (run.status, run.failed, run.passed) == ("done", 1, 2)


@pytest.mark.fleet
def test_a_broker_restart_mid_run_loses_nothing(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Redis (keeping nothing on disk) goes down with turns in flight and turns queued.

    The turns in flight finish and their next turns are published once Redis is back
    (publish retries); the queued ones vanished with Redis, and the sweeper re-enqueues
    them from the store once their run has not moved for AGENTTEST_STALL_SECONDS.
    """
    upgrade(pg_database)
    with (
        RedisServer(tmp_path / "redis") as redis_server,
        WatchingAgent(demo_url, delay=0.5) as agent,
    ):
        fleet = Fleet(
            redis_server.url,
            pg_database,
            tmp_path,
            env={"AGENTTEST_DEMO_URL": demo_url, "AGENTTEST_STALL_SECONDS": "3"},
        )
        try:
            config = write_project(tmp_path, agent.base_url)
            ids = ["B1", "B2", "B3", "B4"]
            cases = write_cases(tmp_path, [expense_case(c) for c in ids])
            worker = fleet.start("r", concurrency=2, wait=False)
            # The submitter waits for the run through the outage, as a user's would.
            submitter = fleet.submit_background(
                ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
            )
            worker.wait_ready()
            agent.wait_for(lambda s: True)  # two conversations in flight, two queued
            run = wait_until(lambda: runs.latest_run(pg_database), 10, "the run")
            waiting = [c for c, phase, _ in case_rows(pg_database, run.id) if phase == "pending"]
            assert waiting, "every conversation had started: nothing was queued"

            redis_server.stop()
            redis_server.start()  # empty: the queue and the unacknowledged messages are gone

            stdout, stderr = submitter.communicate(timeout=90)
            assert submitter.returncode == 0, stderr
            run_id = run_id_of(stderr)
            assert run_id == run.id
            assert "Passed:  4" in stdout
        finally:
            fleet.close()

    _all_turns_once(pg_database, run_id, dict.fromkeys(ids, 3))
    assert [p for _, p, _ in case_rows(pg_database, run_id)] == ["done"] * 4
    # The lost conversations came back through a sweeper (the worker's or the waiting
    # submitter's, whichever claimed them first).
    assert "re-enqueued" in fleet.logs() + stderr, fleet.logs()
    assert set(waiting) <= {s.case for s in agent.seen()}


@pytest.mark.fleet
def test_a_lost_aggregation_is_done_by_the_sweeper(
    fleet: Fleet, demo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run finished but its aggregation message was lost; another run's aggregator
    died after claiming it. A worker's sweeper builds both runs' reports, once each."""
    from agenttest_submit.run.embedded import drive
    from agenttest_submit.run.progress import Progress
    from agenttest_submit.run.runner import store_run
    from agenttest_worker.agents.config import ProjectConfig
    from agenttest_worker.agents.config_loading import load_config
    from agenttest_worker.cases.case_model import Case
    from agenttest_worker.engine import RunOptions

    url = fleet.database_url
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    config: ProjectConfig = load_config(str(write_project(tmp_path, demo_url)))
    cases = [Case.model_validate(greeting_case("G1"))]

    def finished_run() -> str:
        run_id, total = store_run(
            url,
            cases,
            options=RunOptions(target="slow.expense", interactive=False),
            config=config,
            target="slow.expense",
            label="lost aggregation",
        )
        progress = Progress(total)
        asyncio.run(drive(url, run_id, [(c.id, 1) for c in cases], 1, progress))
        progress.close()
        return run_id

    lost = finished_run()
    died = finished_run()
    assert results.claim_aggregation(url, died)  # ... and its aggregator died right there
    stored = [runs.get_run(url, r) for r in (lost, died)]
    assert [r.status if r else None for r in stored] == ["running", "aggregating"]

    fleet.start("sweeper", concurrency=1, stall_seconds="2")
    for run_id in (lost, died):
        fleet.wait_done(run_id, timeout=30)
        assert results.get_report(url, run_id, "jsonl")
    log = wait_until(
        lambda: fleet.logs() if fleet.logs().count("reports built by the sweeper") >= 2 else "",
        10,
        "the sweeper's log",
    )
    assert log.count("reports built by the sweeper") == 2, log


def test_stalled_conversations_are_claimed_by_one_sweeper(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Two sweepers at once on a stalled run: each conversation is re-enqueued once."""
    from agenttest_submit.run.runner import store_run
    from agenttest_worker.agents.config_loading import load_config
    from agenttest_worker.cases.case_model import Case
    from agenttest_worker.engine import RunOptions

    url = pg_database
    config = load_config(str(write_project(tmp_path, demo_url)))
    run_id, _ = store_run(  # stored, never enqueued: as if the broker lost every message
        url,
        [Case.model_validate(greeting_case(f"S{i}")) for i in range(5)],
        options=RunOptions(target="slow.expense", interactive=False),
        config=config,
        target="slow.expense",
        label="never enqueued",
    )
    assert recovery.claim_stalled(url, 60, run_id) == []  # it has not stalled for a minute
    time.sleep(0.6)
    claims: list[list[tuple[str, str, int]]] = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        barrier.wait()
        claims.append(recovery.claim_stalled(url, 0.5, run_id))

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    claimed = sorted(case for batch in claims for _, case, _ in batch)
    assert claimed == [f"S{i}" for i in range(5)]  # each once, by one of the two
    assert all(turn == 1 for batch in claims for _, _, turn in batch)
    assert recovery.claim_stalled(url, 0.5, run_id) == []  # and not again right away


CRASHING_SCRIPT = """
import os
import signal
import time


def respond(messages, metadata):
    # A native crash (a segfault, the out-of-memory killer) takes the whole worker
    # process down with it, whatever else it was running.
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.fleet
def test_only_the_turn_that_keeps_killing_its_worker_is_blamed(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """X1's agent is a script that kills the worker process running it (from inside the
    turn, as a segfault would), while three other conversations are in flight on the
    same worker. Workers are replaced as they die (as a supervisor would). Only X1 fails
    after AGENTTEST_MAX_REDELIVERIES; the conversations that happened to share its
    worker are redelivered too but never blamed: a redelivered turn runs alone in its
    worker, and only a death while it ran alone counts against it."""
    max_deliveries = 1
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "crash.py").write_text(CRASHING_SCRIPT, encoding="utf-8")
    with WatchingAgent(demo_url, delay=1.0) as agent:
        config = write_project(tmp_path, agent.base_url)
        config.write_text(
            config.read_text(encoding="utf-8")
            + "  crashing:\n    protocol: script\n    use: scripts:crash\n"
            + f"scripts_dir: {scripts}\n",
            encoding="utf-8",
        )
        ids = ["OK1", "OK2", "OK3"]
        cases = write_cases(
            tmp_path,
            [{**greeting_case("X1"), "agent": "crashing"}, *(greeting_case(c) for c in ids)],
        )
        settings = {
            "max_redeliveries": str(max_deliveries),
            "visibility_timeout": "2",
            "scripts_dir": str(scripts),
        }
        started: list[Worker] = [fleet.start("w0", concurrency=4, wait=False, **settings)]
        stop = threading.Event()

        def replace_dead_workers() -> None:
            while not stop.wait(0.2):
                if not any(w.alive() for w in started) and len(started) < 8:
                    started.append(
                        fleet.start(f"w{len(started)}", concurrency=4, wait=False, **settings)
                    )

        supervisor = threading.Thread(target=replace_dead_workers, daemon=True)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        started[0].wait_ready()
        supervisor.start()
        try:
            fleet.wait_done(run_id, timeout=90)
        finally:
            stop.set()
            supervisor.join(5)
        # X1's worker died with the other conversations in flight beside it.
        assert len(started) >= 2
        first_worker = {s.case for s in agent.seen() if s.worker == "w0"}
        assert first_worker == set(ids), agent.seen()

    records = {r.id: r for r in results.iter_results(fleet.database_url, run_id)}
    assert {case: r.status for case, r in records.items()} == {
        "X1": "failed",
        **dict.fromkeys(ids, "passed"),
    }, {case: r.error for case, r in records.items()}
    # Once beside the others (not counted: it was not alone), then once alone (counted),
    # then failed without running.
    assert records["X1"].error == (
        "turn 1 was delivered 3 times without finishing (the worker running it died each "
        "time, 1 of them with this turn running alone)"
    ), records["X1"]
    _all_turns_once(fleet.database_url, run_id, dict.fromkeys(ids, 1))
