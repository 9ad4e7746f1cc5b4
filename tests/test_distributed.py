"""The fleet end to end: real `celery worker` processes, real Redis and Postgres, agents over
HTTP. A run on the fleet gives what the embedded default gives; a duplicated message is a
no-op; two conversations ending together aggregate the run once; --fail-fast skips what
is still queued. (Crashes and broker loss: test_faults.py.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
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
from sqlalchemy import select

from agenttest_submit.cli.main import main as submit_main
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import session_scope, upgrade
from agenttest_worker.store.sql.models import RunReportRow, TurnRow

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
STORED_FORMATS = {"jsonl", "console"}

ROUNDS_YAML = """\
tests:
  - name: rounds_dinner
    id: R-DINNER
    tool_mocks:
      create_expense: {id: EXP-R1, status: draft}
    rounds:
      - user_input: I want to submit an expense
        criteria: The reply must ask "what type of expense"
      - user_input: Client dinner, $120
        criteria: The reply must mention "$120" and ask to "confirm"
      - user_input: Yes, confirm
        criteria: The reply must say "submitted" and never "error"
  - name: flat_judged_wrong
    id: R-FLAT
    user_input: Hello
    criteria: The reply must mention "refund"
"""


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _normalized(value: Any) -> Any:
    """A result record minus what differs between two runs of the same cases (times,
    usage, the trace drawn for each conversation)."""
    volatile = {"duration_ms", "latency_ms", "usage", "trace_id"}
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _records(path: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return {r["id"]: r for r in records}


def _verdicts(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    per_turn = [
        (
            t["turn"],
            t.get("input"),
            t.get("input_source"),
            t.get("output"),
            t["status"],
            [(a["type"], a["passed"]) for a in t.get("assertions", [])],
        )
        for t in record.get("turns", [])
    ]
    final = [(a["type"], a["passed"]) for a in record.get("final_assertions", [])]
    return [record["status"], *per_turn, *final]


@pytest.mark.fleet
def test_fleet_run_matches_the_embedded_default(
    any_fleet: Fleet, demo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = any_fleet
    rounds = tmp_path / "rounds.yaml"
    rounds.write_text(ROUNDS_YAML, encoding="utf-8")
    args = [
        "-i",
        str(SUITE / "expense-suite.jsonl"),
        "-i",
        str(rounds),
        "-n",
        "assistants.expense",
        "--config",
        str(SUITE / "agenttest.yaml"),
    ]

    worker = fleet.start("parity", concurrency=4, wait=False)  # starts while we run embedded
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    embedded_out = tmp_path / "embedded.jsonl"
    assert submit_main([*args, "-o", str(embedded_out)]) == 1  # T004 and R-FLAT fail

    worker.wait_ready()
    fleet_out = tmp_path / "fleet.jsonl"
    done = fleet.submit([*args, "-o", str(fleet_out)])
    assert done.returncode == 1, done.stderr
    assert "case(s) enqueued" in done.stderr  # it did run on the fleet

    embedded, distributed = _records(embedded_out), _records(fleet_out)
    assert (
        list(distributed)
        == list(embedded)
        == ["T001", "T002", "T003", "T004", "R-DINNER", "R-FLAT"]
    )
    statuses = {case: record["status"] for case, record in distributed.items()}
    assert statuses == {
        "T001": "passed",
        "T002": "skipped",
        "T003": "passed",
        "T004": "failed",
        "R-DINNER": "passed",
        "R-FLAT": "failed",
    }
    # A simulator drove T003; the rounds' criteria went to the default judge.
    assert {t["input_source"] for t in distributed["T003"]["turns"][1:]} == {"simulator"}
    judged = [a for t in distributed["R-DINNER"]["turns"] for a in t["assertions"]]
    assert [a["type"] for a in judged] == ["agent"] * 3
    for case in embedded:
        assert _verdicts(distributed[case]) == _verdicts(embedded[case]), case
        assert _normalized(distributed[case]) == _normalized(embedded[case]), case


@pytest.mark.fleet
def test_conversations_under_way_go_before_new_ones(
    any_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """One worker taking one message at a time plays each conversation to its end
    before starting the next: later turns are popped before queued first turns."""
    fleet = any_fleet
    config = write_project(tmp_path, demo_url)
    cases = write_cases(tmp_path, [expense_case(f"P{i}", turns=3) for i in range(4)])
    fleet.start("one", concurrency=1)
    run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "slow.expense", "--config", str(config)])
    fleet.wait_done(run_id)
    with session_scope(fleet.database_url) as session:
        played = session.execute(
            select(TurnRow.case_id, TurnRow.turn)
            .where(TurnRow.run_id == run_id)
            .order_by(TurnRow.created_at)
        ).all()
    assert [(c, t) for c, t in played] == [(f"P{i}", t) for i in range(4) for t in (1, 2, 3)]
    assert [s for _, _, s in case_rows(fleet.database_url, run_id)] == ["passed"] * 4


@pytest.mark.fleet
def test_the_fleet_starts_conversations_while_their_run_is_still_being_stored(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """Each batch of cases is started as soon as it is stored: with one case per batch,
    the agent hears from the first conversations while later cases are still being
    written (the run still `pending`), and the run ends as any other."""
    heard_while: list[str] = []

    def note_run_status(_: object) -> None:
        run = runs.latest_run(fleet.database_url)
        heard_while.append(run.status if run else "no run")

    with WatchingAgent(demo_url) as agent:
        agent.on_request = note_run_status
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [greeting_case(f"E{i:04d}") for i in range(1000)])
        fleet.start("early", concurrency=8)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)], enqueue_batch="1"
        )
        fleet.wait_done(run_id)
        wait_until(lambda: len(heard_while) == 1000, 10, "every call to be noted")
    assert heard_while[0] == "pending", heard_while[:5]
    assert [s for _, _, s in case_rows(fleet.database_url, run_id)] == ["passed"] * 1000
    assert set(turn_rows(fleet.database_url, run_id).values()) == {1}
    assert len(_reports(fleet.database_url, run_id)) == len(STORED_FORMATS)


@pytest.mark.fleet
def test_a_duplicated_turn_message_is_a_no_op(fleet: Fleet, demo_url: str, tmp_path: Path) -> None:
    """D1 gets duplicated and stale messages, D2 (the same conversation) none."""
    from agenttest_worker.fleet.celery_app import app
    from agenttest_worker.fleet.tasks import turn

    with WatchingAgent(demo_url, delay=0.3) as agent:
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [expense_case("D1"), expense_case("D2")])
        worker = fleet.start("dup", concurrency=8, wait=False)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        worker.wait_ready()
        agent.wait_for(lambda s: s.case == "D1" and s.turn == 2)
        # D1's turn 2 is in flight: send it again twice, plus the turn it already did
        # and one it has not reached yet.
        with app.connection_for_write(fleet.broker_url) as connection:
            for number in (2, 2, 1, 3):
                turn.apply_async((run_id, "D1", number), connection=connection)
        fleet.wait_done(run_id)
        wait_until(
            lambda: fleet.logs().count("D1 turn") == 7,
            10,
            "the worker to log every task",
        )

    records = {
        r.id: json.dumps(_normalized(r.model_dump(mode="json")), sort_keys=True)
        for r in results.iter_results(fleet.database_url, run_id)
    }
    # The two cases are the same but for their id and the line they stand on.
    d1, d2 = json.loads(records["D1"]), json.loads(records["D2"])
    assert (d1.pop("line"), d2.pop("line")) == (1, 2)
    assert json.dumps(d1, sort_keys=True) == json.dumps(d2, sort_keys=True).replace("D2", "D1")
    assert d1["status"] == "passed"
    assert turn_rows(fleet.database_url, run_id) == {
        (case, number): 1 for case in ("D1", "D2") for number in (1, 2, 3)
    }
    log = fleet.logs()
    # Two of the three D1 turn-2 tasks lost the race to save it (or came after); the
    # stale turn 1 and the early turn 3 found nothing to do. Each was a no-op.
    assert log.count("D1 turn 2: already recorded") == 2, log
    assert log.count("D1 turn 1: already recorded") == 1, log
    assert log.count("D1 turn 3: already recorded") == 1, log
    # And none of them spawned a second copy of the rest of the conversation.
    assert log.count("D1 turn 2: next turn 3") == 1, log
    assert log.count("D1 turn 3: case passed") == 1, log
    assert [s.turn for s in agent.seen("D1")].count(1) == 1  # the stale turn 1 called nobody


def _aggregations(log: str, run_id: str) -> tuple[int, int]:
    return log.count(f"'{run_id}: aggregated'"), log.count(f"'{run_id}: already aggregated'")


def _reports(url: str, run_id: str) -> list[str]:
    """The formats of the run's stored reports (each stored in parts)."""
    from sqlalchemy import select

    with session_scope(url) as session:
        return list(
            session.scalars(
                select(RunReportRow.format).where(RunReportRow.run_id == run_id).distinct()
            )
        )


@pytest.mark.fleet
def test_two_conversations_ending_at_once_aggregate_the_run_once(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    with WatchingAgent(demo_url) as agent:
        # Two one-turn conversations: both requests are held until both have arrived,
        # then answered at the same moment, so both conversations end together.
        agent.together(lambda s: True, 2)
        config = write_project(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, [greeting_case("E1"), greeting_case("E2")])
        worker = fleet.start("pair", concurrency=4, wait=False)
        run_id = fleet.submit_no_wait(
            ["-i", str(cases), "-n", "slow.expense", "--config", str(config)]
        )
        worker.wait_ready()
        fleet.wait_done(run_id)
        wait_until(lambda: _aggregations(fleet.logs(), run_id)[0], 10, "the aggregation log")

    assert sorted(str(s.case) for s in agent.seen()) == ["E1", "E2"]
    aggregated, already = _aggregations(fleet.logs(), run_id)
    assert aggregated == 1 and already <= 1, fleet.logs()
    assert sorted(_reports(fleet.database_url, run_id)) == sorted(STORED_FORMATS)
    run = runs.get_run(fleet.database_url, run_id)
    assert run is not None and (run.status, run.finished_cases, run.passed) == ("done", 2, 2)


def _race(call: Callable[[], object]) -> list[object]:
    """`call()` from two threads released at the same instant; what each returned."""
    barrier = threading.Barrier(2)
    returned: list[object] = []

    def contender() -> None:
        barrier.wait()
        returned.append(call())

    threads = [threading.Thread(target=contender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return returned


def test_racing_aggregators_build_the_reports_once(
    pg_database: str, demo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aggregate() called from two threads at the same moment on finished runs."""
    import asyncio

    from agenttest_submit.run.embedded import drive
    from agenttest_submit.run.progress import Progress
    from agenttest_submit.run.runner import store_run
    from agenttest_worker.agents.config_loading import load_config
    from agenttest_worker.cases.case_model import Case
    from agenttest_worker.engine import RunOptions
    from agenttest_worker.report.aggregation import aggregate

    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    config = load_config(str(SUITE / "agenttest.yaml"))
    cases = [Case.model_validate(greeting_case(f"A{i}")) for i in range(2)]
    for _ in range(5):
        run_id, total = store_run(
            pg_database,
            cases,
            options=RunOptions(target="assistants.expense", interactive=False),
            config=config,
            target="assistants.expense",
            label="race",
        )
        progress = Progress(total)
        asyncio.run(drive(pg_database, run_id, [(c.id, 1) for c in cases], 2, progress))
        progress.close()
        run = runs.get_run(pg_database, run_id)
        assert run is not None and (run.status, run.finished_cases) == ("running", 2)

        won = [built is not None for built in _race(partial(aggregate, pg_database, run_id))]
        assert sorted(won) == [False, True]
        assert sorted(_reports(pg_database, run_id)) == sorted(STORED_FORMATS)
        run = runs.get_run(pg_database, run_id)
        assert run is not None and run.status == "done"


@pytest.mark.fleet
def test_fail_fast_on_the_fleet_skips_the_queued_conversations(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    with WatchingAgent(demo_url) as agent:
        config = write_project(tmp_path, agent.base_url)
        failing = greeting_case("F1")
        failing["assertions"] = [{"type": "contains", "value": "no such words"}]
        cases = write_cases(tmp_path, [failing, *(expense_case(f"F{i}", 3) for i in range(2, 5))])
        # One worker, one turn at a time: F1 runs first, the others are still queued.
        fleet.start("ff", concurrency=1, wait=False)  # ready while the submitter starts
        out = tmp_path / "ff.jsonl"
        done = fleet.submit(
            [
                "-i",
                str(cases),
                "-n",
                "slow.expense",
                "--config",
                str(config),
                "--fail-fast",
                "-o",
                str(out),
            ]
        )
    assert done.returncode == 1, done.stderr
    records = _records(out)
    assert records["F1"]["status"] == "failed"
    reason = "not run: --fail-fast stopped the run after F1 failed"
    for case in ("F2", "F3", "F4"):
        assert records[case]["status"] == "skipped", records[case]
        assert reason in json.dumps(records[case]), records[case]
    assert {s.case for s in agent.seen()} == {"F1"}  # no skipped case reached the agent
    run_id = run_id_of(done.stderr)
    assert [(c, p) for c, p, _ in case_rows(fleet.database_url, run_id)] == [
        (c, "done") for c in ("F1", "F2", "F3", "F4")
    ]


def _one_case_run(database_url: str, case: dict[str, Any]) -> str:
    """A stored, started run of one case against the demo suite's agents."""
    from agenttest_submit.run.runner import store_run
    from agenttest_worker.agents.config_loading import load_config
    from agenttest_worker.cases.case_model import Case
    from agenttest_worker.engine import RunOptions

    run_id, _ = store_run(
        database_url,
        [Case.model_validate(case)],
        options=RunOptions(target="assistants.expense", interactive=False),
        config=load_config(str(SUITE / "agenttest.yaml")),
        target="assistants.expense",
        label="redelivery",
    )
    return run_id


def _worker_step(database_url: str, run_id: str, case_id: str, turn: int) -> Any:
    """One turn as a worker runs it (max 3 deliveries), minus enqueueing what follows."""
    import asyncio

    from agenttest_worker.agents.http.exchange import close_session
    from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
    from agenttest_worker.driver.step import PoolCache

    async def step() -> Any:
        try:
            at = TurnAddress(run_id, case_id, turn, 3)
            return await run_step(SqlStore(database_url), PoolCache(), at, inline)
        finally:
            await close_session()

    return asyncio.run(step())


def test_only_a_redelivered_message_resends_the_next_turn(
    pg_database: str, demo_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that died between saving turn N and enqueueing N+1 left no N+1 message;
    the broker gives N back (redelivered) and that copy enqueues N+1. A plain duplicate
    of N does nothing, or every duplicate would run the rest of the conversation twice."""
    from agenttest_worker.driver.step import Advance, prepare

    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    run_id = _one_case_run(pg_database, expense_case("N1"))
    advance = _worker_step(pg_database, run_id, "N1", 1)
    assert (advance.saved, advance.next_turn) == (True, 2)  # ... and then the worker died

    store = SqlStore(pg_database)
    duplicate = prepare(store, run_id, "N1", 1, 3, redelivered=False)
    redelivery = prepare(store, run_id, "N1", 1, 3, redelivered=True)
    assert isinstance(duplicate, Advance) and isinstance(redelivery, Advance)
    assert (duplicate.saved, duplicate.next_turn) == (False, None)
    assert (redelivery.saved, redelivery.next_turn) == (False, 2)
    loaded = store.load_case(run_id, "N1")
    assert loaded is not None and loaded.deliveries == 0  # stale copies use no budget


def test_a_redelivered_copy_of_the_step_that_ended_the_run_aggregates_it(
    pg_database: str, demo_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that died between saving a run's last step and enqueueing its
    aggregation left no aggregation message; the broker gives the step back
    (redelivered) and that copy enqueues it. A plain duplicate does not, and once the
    run is aggregated a redelivery asks for nothing more."""
    from agenttest_worker.driver.step import Advance, prepare
    from agenttest_worker.report.aggregation import aggregate

    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    run_id = _one_case_run(pg_database, greeting_case("L1"))
    advance = _worker_step(pg_database, run_id, "L1", 1)
    assert (advance.saved, advance.case_done, advance.run_finished) == (True, True, True)
    # ... and then the worker died before enqueueing the aggregation.

    store = SqlStore(pg_database)
    duplicate = prepare(store, run_id, "L1", 1, 3, redelivered=False)
    redelivery = prepare(store, run_id, "L1", 1, 3, redelivered=True)
    assert duplicate == Advance(saved=False, case_done=True)
    assert redelivery == Advance(saved=False, case_done=True, run_finished=True)

    assert aggregate(pg_database, run_id) is not None
    after = prepare(store, run_id, "L1", 1, 3, redelivered=True)
    assert after == Advance(saved=False, case_done=True)


@pytest.mark.fleet
@pytest.mark.parametrize("down", ["database", "broker"])
def test_a_service_out_of_reach_is_named_and_nothing_is_left_stored(
    down: str, redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Exit 3 with the service, its address (password hidden) and the driver's reason;
    no "internal error", no traceback, and no half-started run left in the store."""
    closed = "127.0.0.1:1"  # nothing listens there
    broker = f"redis://:s3cret@{closed}/0" if down == "broker" else redis_db
    database = f"postgresql://postgres:s3cret@{closed}/x" if down == "database" else pg_database
    config = write_project(tmp_path, demo_url)
    cases = write_cases(tmp_path, [greeting_case("DOWN1")])
    upgrade(pg_database)
    before = runs.latest_run(pg_database)
    fleet = Fleet(broker, database, tmp_path)
    done = fleet.submit(["-i", str(cases), "-n", "slow.expense", "--config", str(config)])
    assert done.returncode == 3, done.stderr
    address = {"broker": "redis://:***@", "database": "postgresql://postgres:***@"}[down] + closed
    assert f"agenttest-submit: cannot reach the {down} at {address}" in done.stderr
    assert "refused" in done.stderr.lower()
    assert "s3cret" not in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    after = runs.latest_run(pg_database)
    assert (after.id if after else None) == (before.id if before else None)


@pytest.mark.fleet
def test_task_routes_send_a_run_to_the_queue_its_workers_consume(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    """The fleet's tasks are published through Celery, so the app's `task_routes` (from
    AGENTTEST_CELERY_CONFIG) apply: a worker consuming only the routed queue plays the
    whole run, and nothing waits in the default queue."""
    from agenttest_worker.fleet.celery_app import app

    (tmp_path / "routed_celery.py").write_text(
        'task_routes = {"agenttest.*": {"queue": "routed"}}\n', encoding="utf-8"
    )
    fleet.env["PYTHONPATH"] = str(tmp_path)
    fleet.env["AGENTTEST_CELERY_CONFIG"] = "routed_celery"
    config = write_project(tmp_path, demo_url)
    cases = write_cases(tmp_path, [expense_case("Q1"), greeting_case("Q2")])
    fleet.start("routed", concurrency=2, args=["-Q", "routed"])
    run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "slow.expense", "--config", str(config)])
    fleet.wait_done(run_id)
    assert [s for _, _, s in case_rows(fleet.database_url, run_id)] == ["passed"] * 2
    with app.connection_for_write(fleet.broker_url) as connection:
        channel = connection.default_channel
        for queue in ("agenttest", "routed"):
            assert channel.queue_purge(queue) == 0, queue


def test_publishing_a_turn_sends_celerys_publish_signals(redis_db: str) -> None:
    """`before_task_publish` fires for each turn published (what trace propagation hooks
    into: a header it adds travels with the message), then `after_task_publish`."""
    from celery.signals import after_task_publish, before_task_publish

    from agenttest_worker.fleet.celery_app import app
    from agenttest_worker.fleet.enqueue import enqueue_turn

    seen: list[tuple[str, Any]] = []

    def before(sender: str, body: Any, headers: dict[str, Any], **_: Any) -> None:
        headers["traceparent"] = "00-trace-span-01"
        seen.append(("before", (sender, headers["task"], list(body[0]))))

    def after(sender: str, **_: Any) -> None:
        seen.append(("after", sender))

    before_task_publish.connect(before)
    after_task_publish.connect(after)
    try:
        with app.connection_for_write(redis_db) as connection, connection.Producer() as producer:
            queue = app.conf.task_default_queue
            connection.default_channel.queue_purge(queue)
            enqueue_turn("r1", "c1", 2, producer)
            message = connection.default_channel.basic_get(queue, no_ack=True)
    finally:
        before_task_publish.disconnect(before)
        after_task_publish.disconnect(after)
    turn = ["r1", "c1", 2]
    assert seen == [
        ("before", ("agenttest.turn", "agenttest.turn", turn)),
        ("after", "agenttest.turn"),
    ]
    assert message is not None
    assert message.headers["task"] == "agenttest.turn"
    assert message.headers["traceparent"] == "00-trace-span-01"
    assert list(message.decode()[0]) == turn
