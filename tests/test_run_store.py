"""What an embedded run leaves in the store, aggregation, and `resume` of unfinished runs."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import DataError

from agenttest_submit.cli.main import main, parse_run
from agenttest_submit.inputs.expand import expand
from agenttest_submit.inputs.sources import parse_input
from agenttest_submit.run.embedded import drive
from agenttest_submit.run.progress import Progress
from agenttest_submit.run.runner import run_options, store_records, store_run
from agenttest_submit.run.storing import NewRun, write_run
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
from agenttest_worker.driver.step import Advance, PoolCache, end_refused, prepare
from agenttest_worker.engine import HumanPrompt, RunOptions
from agenttest_worker.report.aggregation import aggregate
from agenttest_worker.results import AgentCallRecord, CaseResult, TurnResult, Usage
from agenttest_worker.settings import get_settings
from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.memory.buffered import BufferedStore
from agenttest_worker.store.sql import recovery, runs, turn_statements
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql.db import session_scope, upgrade
from agenttest_worker.store.sql.models import CaseRow, RunReportRow, RunRow, TurnRow

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")
RUN_ID = re.compile(r"ℹ Run: (\S+)")


def url() -> str:
    get_settings.cache_clear()
    return get_settings().effective_database_url()


def run_suite(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def stored_suite(options: RunOptions | None = None) -> tuple[str, str]:
    """The suite stored as a run whose conversations have not started: (url, run id)."""
    config = load_config(SUITE_CONFIG)
    cases = expand([parse_input(SUITE_CASES)], config, target="assistants.expense").cases
    if options is None:
        options = run_options(parse_run(["-i", SUITE_CASES]), config, "assistants.expense")
    db = url()
    run_id, total = store_run(
        db, cases, options=options, config=config, target="assistants.expense", label="suite"
    )
    assert total == 4
    return db, run_id


def step(db: str, run_id: str, case_id: str, turn: int) -> Any:
    async def once() -> Any:
        from agenttest_worker.agents.http.exchange import close_session

        try:
            at = TurnAddress(run_id, case_id, turn, None)
            return await run_step(SqlStore(db), PoolCache(), at, inline)
        finally:
            await close_session()

    return asyncio.run(once())


def case_rows(db: str, run_id: str) -> dict[str, CaseRow]:
    with session_scope(db) as session:
        rows = session.scalars(select(CaseRow).where(CaseRow.run_id == run_id)).all()
        return {row.case_id: row for row in rows}


def check_store_matches_results(db: str, run_id: str) -> list[CaseResult]:
    """One turns row per (case, turn) of the results, and run counters that agree."""
    records = list(results.iter_results(db, run_id))
    expected = {(r.id, t.turn) for r in records for t in r.turns}
    counted = results.count_turn_rows(db, run_id)
    assert {(c, t) for c, t, _ in counted} == expected
    assert all(n == 1 for _, _, n in counted), counted
    with session_scope(db) as session:
        rows = session.scalars(select(TurnRow).where(TurnRow.run_id == run_id)).all()
        by_key = {(row.case_id, row.turn): row for row in rows}
    for result in records:
        for turn in result.turns:
            row = by_key[(result.id, turn.turn)]
            assert (row.input, row.output, row.status) == (turn.input, turn.output, turn.status)
    run = runs.get_run(db, run_id)
    assert run is not None
    statuses = [r.status for r in records]
    assert (
        run.total_cases,
        run.finished_cases,
        run.passed,
        run.failed,
        run.skipped,
        run.total_turns,
    ) == (
        len(records),
        len(records),
        statuses.count("passed"),
        statuses.count("failed"),
        statuses.count("skipped"),
        sum(r.total_turns for r in records),
    )
    return records


# -- after a run ---------------------------------------------------------------------------


def test_a_run_stores_each_turn_once_counters_and_reports(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_suite(capsys, "-o", "results.jsonl")
    assert code == 1
    run_id = RUN_ID.search(out).group(1)  # type: ignore[union-attr]
    db = url()

    records = check_store_matches_results(db, run_id)
    assert [r.status for r in records] == ["passed", "skipped", "passed", "failed"]
    # Read in batches smaller than the run, the records come in the same order, once each.
    for batch in (1, 3):
        texts = list(results.iter_result_texts(db, run_id, batch=batch))
        assert [CaseResult.model_validate_json(t).id for t in texts] == [r.id for r in records]
    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "done" and run.finished_at is not None
    assert (run.passed, run.failed, run.skipped, run.total_turns) == (2, 1, 1, 8)
    assert run.agent == "assistants.expense"
    assert run.total_tokens > 0
    assert "Total turns: 8\n" in out and "Passed:  2\n" in out
    # The conversations began before the run was stored (its row is written meanwhile):
    # the reports' duration counts from then, not from when storing ended.
    assert run.started_at is not None and run.started_at <= run.created_at

    with session_scope(db) as session:
        formats = set(
            session.scalars(select(RunReportRow.format).where(RunReportRow.run_id == run_id))
        )
    assert formats == {"jsonl", "console"}
    stored_jsonl = results.get_report(db, run_id, "jsonl")
    assert stored_jsonl == (demo / "results.jsonl").read_text(encoding="utf-8")
    console = results.get_report(db, run_id, "console")
    assert console is not None and "► [T004] Greeting mentions refunds (1 turn)" in console
    assert '✓ agent: The reply must mention "$3500"' in console
    assert "\x1b[" not in console, "stored reports carry no terminal colors"

    # The run is aggregated already: another aggregation does nothing.
    assert aggregate(db, run_id) is None
    assert results.get_report(db, run_id, "jsonl") == stored_jsonl


def test_aggregate_runs_once_and_only_when_every_conversation_ended(demo: Path) -> None:
    db, run_id = stored_suite()
    assert aggregate(db, run_id) is None, "conversations still pending"
    assert results.get_report(db, run_id, "jsonl") is None

    asyncio.run(drive(db, run_id, [(f"T00{i}", 1) for i in range(1, 5)], 4, Progress(4)))
    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "running" and run.finished_cases == 4

    assert aggregate(db, run_id) is not None
    assert aggregate(db, run_id) is None
    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "done"
    jsonl = results.get_report(db, run_id, "jsonl")
    assert jsonl is not None
    assert [json.loads(line)["id"] for line in jsonl.splitlines()] == [
        "T001",
        "T002",
        "T003",
        "T004",
    ]
    check_store_matches_results(db, run_id)


def test_a_repeated_step_records_nothing_twice(demo: Path) -> None:
    db, run_id = stored_suite()
    first = step(db, run_id, "T001", 1)
    assert first.saved and first.next_turn == 2
    again = step(db, run_id, "T001", 1)  # a redelivered task for a turn already recorded
    assert not again.saved
    assert results.count_turn_rows(db, run_id) == [("T001", 1, 1)]


# -- a fleet run: conversations start batch by batch while the run is being stored ---------


def play(db: str, run_id: str, case_id: str) -> list[Any]:
    """Every step of one conversation, to its end."""
    advances: list[Any] = []
    turn: int | None = 1
    while turn is not None:
        advances.append(step(db, run_id, case_id, turn))
        assert advances[-1].saved, (case_id, turn)
        turn = advances[-1].next_turn
    return advances


class PlayingStarter:
    """A RunStarter that plays each stored batch's conversations to their end at once
    (as a fleet that is fast enough would), noting what the store held meanwhile."""

    def __init__(self, db: str, play_them: bool = True) -> None:
        self.db, self.play_them = db, play_them
        self.batches: list[tuple[int, int, list[str], str]] = []
        self.ended: list[bool] = []

    def stored(self, run_id: str, first: int, last: int) -> None:
        run = runs.get_run(self.db, run_id)
        assert run is not None
        self.batches.append((first, last, sorted(case_rows(self.db, run_id)), run.status))
        if not self.play_them:
            return
        for case_id in recovery.pending_case_ids(self.db, run_id, first, last):
            assert not any(a.run_finished for a in play(self.db, run_id, case_id))

    def started(self, run_id: str, every_case_ended: bool) -> None:
        self.ended.append(every_case_ended)


def _store_suite_with(starter: PlayingStarter) -> tuple[str, str]:
    config = load_config(SUITE_CONFIG)
    cases = expand([parse_input(SUITE_CASES)], config, target="assistants.expense").cases
    run_id, total = store_records(
        starter.db,
        ((c.id, c.agent, c.to_record()) for c in cases),
        options=run_options(parse_run(["-i", SUITE_CASES]), config, "assistants.expense"),
        config=config,
        target="assistants.expense",
        label="suite",
        starter=starter,
    )
    assert total == 4
    return starter.db, run_id


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_conversations_can_run_while_their_run_is_still_being_stored(
    demo: Path, database: str, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch is handed to the starter as soon as it is stored (a fleet starts it
    then). Conversations that end while the run is still `pending` do not finish it;
    the start says they all ended, so that the submitter enqueues the aggregation."""
    monkeypatch.setenv("AGENTTEST_ENQUEUE_BATCH", "2")
    if database == "postgres":
        monkeypatch.setenv("AGENTTEST_DATABASE_URL", pg_database)
    starter = PlayingStarter(url())
    db, run_id = _store_suite_with(starter)

    # In order, each once it is stored (on Postgres the next batch may be stored by then:
    # two are written at once), the run still pending.
    assert [(first, last, status) for first, last, _, status in starter.batches] == [
        (0, 1, "pending"),
        (2, 3, "pending"),
    ]
    assert {"T001", "T002"} <= set(starter.batches[0][2])
    assert starter.batches[1][2] == ["T001", "T002", "T003", "T004"]
    assert starter.ended == [True]
    run = runs.get_run(db, run_id)
    assert run is not None and (run.status, run.finished_cases, run.total_cases) == (
        "running",
        4,
        4,
    )
    if database == "postgres":  # (SQLite's own timestamps have whole seconds)
        # Started when its first batch was handed out, before any of its turns, not
        # when the last batch was stored.
        with session_scope(db) as session:
            first_turn = session.scalar(
                select(func.min(TurnRow.created_at)).where(TurnRow.run_id == run_id)
            )
        assert run.started_at is not None and first_turn is not None
        assert run.created_at <= run.started_at <= first_turn
    assert aggregate(db, run_id) is not None
    check_store_matches_results(db, run_id)


def test_a_batch_the_database_refuses_removes_the_run_with_every_batch_stored(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches are stored two at a time on Postgres: when one is refused (an agent name
    longer than its column), the error is raised once no batch is being written any
    more, the run is gone with every case stored before it (a case cannot outlive its
    run), and only the batches before it were handed on, in order."""
    monkeypatch.setenv("AGENTTEST_ENQUEUE_BATCH", "2")
    get_settings.cache_clear()
    starter = PlayingStarter(pg_database, play_them=False)
    config = load_config(SUITE_CONFIG)
    records = [(f"c{i}", "x" * (300 if i == 9 else 5), {"id": f"c{i}"}) for i in range(40)]
    with pytest.raises(DataError) as refused:
        store_records(
            pg_database,
            iter(records),
            options=RunOptions(),
            config=config,
            target=None,
            label="refused",
            starter=starter,
        )
    assert isinstance(refused.value.orig, psycopg.errors.StringDataRightTruncation)
    firsts = [first for first, _, _, _ in starter.batches]
    assert firsts == list(range(0, 2 * len(firsts), 2)) and len(firsts) <= 4
    with session_scope(pg_database) as session:  # (its cases would go with it)
        assert session.scalars(select(RunRow).where(RunRow.input_label == "refused")).all() == []


def test_a_run_started_before_its_conversations_end_is_finished_by_them(
    demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual case: nothing had ended when the run started; the conversation that
    ends last finishes the run (and enqueues the aggregation) as before."""
    monkeypatch.setenv("AGENTTEST_ENQUEUE_BATCH", "3")
    starter = PlayingStarter(url(), play_them=False)
    db, run_id = _store_suite_with(starter)
    assert [(first, last, status) for first, last, _, status in starter.batches] == [
        (0, 2, "pending"),
        (3, 3, "pending"),
    ]
    assert starter.ended == [False]
    finished = [play(db, run_id, case_id)[-1].run_finished for case_id in case_rows(db, run_id)]
    assert finished == [False, False, False, True]


# -- a new embedded run: conversations start while the run is being stored -----------------


def fresh_suite(work: Any) -> tuple[str, str, BufferedStore, list[Any]]:
    """The suite as a new embedded run's BufferedStore, its setup running `work(store
    the run)` on the store's thread: (url, run id, store, records)."""
    config = load_config(SUITE_CONFIG)
    cases = expand([parse_input(SUITE_CASES)], config, target="assistants.expense").cases
    records = [(c.id, "assistants.expense", c.to_record()) for c in cases]
    options = run_options(parse_run(["-i", SUITE_CASES]), config, "assistants.expense")
    db, run_id = url(), steps.new_run_id()
    stored = {"options": options.model_dump(mode="json"), "config": config.stored()}

    def store_the_run() -> None:
        run = NewRun(run_id, target="assistants.expense", label="suite", deadline_at=None,
                     **stored)  # fmt: skip
        write_run(db, run, records)

    store = BufferedStore.fresh(
        db, run_id, records, len(records), deadline_at=None, setup=lambda: work(store_the_run),
        **stored,
    )  # fmt: skip
    assert list(store.admitting()) == [(c.id, 1) for c in cases]  # every case, in order
    store.flush_every = 0  # every maybe_flush would write, if it could
    return db, run_id, store, records


@contextmanager
def turn_writes_failing(db: str) -> Iterator[None]:
    """While inside, the SQLite store `db` refuses every new turn row ("disk trouble",
    an error that is not the value's fault), as a disk or a database in trouble would."""
    import sqlite3

    from sqlalchemy.engine import make_url

    path = make_url(db).database
    assert path
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE IF NOT EXISTS write_trouble (x INTEGER);"
            "INSERT INTO write_trouble VALUES (1);"
            "CREATE TRIGGER IF NOT EXISTS trouble BEFORE INSERT ON turns"
            " WHEN (SELECT count(*) FROM write_trouble) > 0"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END;"
        )
    try:
        yield
    finally:
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM write_trouble")


def step_in(store: BufferedStore, case_id: str, turn: int) -> Any:
    async def once() -> Any:
        from agenttest_worker.agents.http.exchange import close_session

        try:
            at = TurnAddress(store.run_id, case_id, turn, None)
            return await run_step(store, PoolCache(), at, inline)
        finally:
            await close_session()

    return asyncio.run(once())


def test_a_new_runs_steps_wait_in_memory_until_the_run_is_stored(demo: Path) -> None:
    stored = threading.Event()

    def when_released(store_the_run: Any) -> None:
        stored.wait(30)
        store_the_run()

    db, run_id, store, _ = fresh_suite(when_released)
    upgrade(db)  # the tables exist; the run is what is not there yet
    first = step_in(store, "T001", 1)
    assert first.saved and first.next_turn == 2
    store.maybe_flush()  # the setup is not done: returns at once and writes nothing
    assert runs.get_run(db, run_id) is None
    assert results.count_turn_rows(db, run_id) == []

    stored.set()
    store.flush()  # waits for the setup, then writes what was buffered
    assert results.count_turn_rows(db, run_id) == [("T001", 1, 1)]
    rows = case_rows(db, run_id)
    assert (rows["T001"].next_turn, rows["T001"].phase) == (2, "ready")
    assert {rows[c].phase for c in ("T002", "T003", "T004")} == {"pending"}

    # The same conversation, stepped again from the store the setup wrote, agrees.
    again = step(db, run_id, "T001", 1)
    assert not again.saved, "turn 1 is recorded once, whichever store is asked"


def test_a_failed_run_setup_fails_the_run_at_its_next_write(demo: Path) -> None:
    def cannot(store_the_run: Any) -> None:
        raise OSError(28, "No space left on device")

    _, _, store, _ = fresh_suite(cannot)
    assert step_in(store, "T001", 1).saved
    with pytest.raises(OSError, match="No space left"):
        store.maybe_flush()  # the setup is done (it failed): the first write says so


def test_a_flush_that_fails_keeps_what_it_did_not_write(demo: Path) -> None:
    """A write of the buffer that fails (a database error, or Ctrl-C or SIGTERM landing in
    it) is rolled back, and what it held is written by the next flush (the run's cleanup
    flushes once more), not lost."""
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run())
    store.flush()  # the run and its cases are stored
    assert step_in(store, "T001", 1).saved
    with turn_writes_failing(db):
        with pytest.raises(Exception, match="disk trouble"):
            store.flush()
        assert results.count_turn_rows(db, run_id) == []
        assert case_rows(db, run_id)["T001"].next_turn == 1, "rolled back with the turn"
    store.flush()
    assert results.count_turn_rows(db, run_id) == [("T001", 1, 1)]
    assert (case_rows(db, run_id)["T001"].next_turn, case_rows(db, run_id)["T001"].phase) == (
        2,
        "ready",
    )


def _refusable_step(run_id: str, turn: int, state: str) -> steps.Step:
    """Turn `turn` of T001 with a call reporting more tokens than SQLite's 64 bits hold."""
    huge = Usage(prompt_tokens=10**20, completion_tokens=1, total_tokens=10**20 + 1)
    call = AgentCallRecord(role="target", agent="a", latency_ms=1, usage=huge)
    played = TurnResult(turn=turn, input="hi", output="ok", calls=[call])
    return steps.Step(
        run_id=run_id, case_id="T001", expected_turn=turn, next_turn=turn + 1,
        phase="ready", state=steps.JsonText(state), new_turns=[played],
    )  # fmt: skip


def test_a_refusal_learned_a_flush_later_takes_back_the_steps_saved_since(
    demo: Path,
) -> None:
    """A flush handed over without waiting learns of a refused step only at the next
    flush, by which time its conversation may have played on: the refused step and
    every later one are taken back, none of them written, and the run's counters are
    as if they never ran."""
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run())
    store.flush()
    prepared = prepare(store, run_id, "T001", 1)
    assert not isinstance(prepared, Advance)
    state = prepared.state.model_dump_json()
    assert store.save_step(_refusable_step(run_id, 1, state)).saved
    store.flush(wait=False)  # handed over; its outcome is taken at the next flush
    later = TurnResult(turn=2, input="and then", output="ok")
    assert store.save_step(steps.Step(
        run_id=run_id, case_id="T001", expected_turn=2, next_turn=3, phase="ready",
        state=steps.JsonText(state), new_turns=[later],
    )).saved  # fmt: skip
    assert store.take_refused() == []

    store.flush()
    (refused,) = store.take_refused()
    assert (refused.case_id, refused.turn) == ("T001", 1)
    assert "too large" in refused.reason
    loaded = store.load_case(run_id, "T001")
    assert loaded is not None and loaded.next_turn == 1, "back to before the refused step"
    assert results.count_turn_rows(db, run_id) == [], "neither step was written"
    assert case_rows(db, run_id)["T001"].next_turn == 1
    run = runs.get_run(db, run_id)
    assert run is not None and (run.finished_cases, run.total_tokens) == (0, 0)


def test_a_flush_handed_over_that_fails_is_written_by_a_later_one(
    demo: Path,
) -> None:
    """A write handed over without waiting that the database rolls back is reported by
    the next flush, and what it held is kept: a later flush writes it, before and with
    what was saved since."""
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run())
    store.flush()

    def save_turn_one(case_id: str) -> None:
        prepared = prepare(store, run_id, case_id, 1)
        assert not isinstance(prepared, Advance)
        played = TurnResult(turn=1, input="hi", output="ok")
        assert store.save_step(steps.Step(
            run_id=run_id, case_id=case_id, expected_turn=1, next_turn=2, phase="ready",
            state=steps.JsonText(prepared.state.model_dump_json()), new_turns=[played],
        )).saved  # fmt: skip

    with turn_writes_failing(db):
        save_turn_one("T001")
        store.flush(wait=False)  # handed over: it fails on the store's thread meanwhile
        save_turn_one("T002")
        with pytest.raises(Exception, match="disk trouble"):
            store.flush()  # T001's outcome, taken first
        assert results.count_turn_rows(db, run_id) == []
    store.flush()
    assert sorted(results.count_turn_rows(db, run_id)) == [("T001", 1, 1), ("T002", 1, 1)]


def test_a_refused_reply_to_a_parked_conversation_ends_it_failed_still_parked(
    demo: Path,
) -> None:
    """The step the database refuses can be a person's reply to a conversation parked
    for one: the conversation goes back to waiting for it, and is ended from there
    (failed, with the database's reason), not left waiting for ever."""
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run())
    store.flush()
    prepared = prepare(store, run_id, "T001", 1)
    assert not isinstance(prepared, Advance)
    parked = prepared.state.model_copy(deep=True)
    parked.phase = "awaiting_human"
    parked.prompt = HumanPrompt(question="Which project?", hint=None, asked_at=0.0)
    common = {"run_id": run_id, "case_id": "T001", "expected_turn": 1, "next_turn": 1}
    assert store.save_step(steps.Step(
        **common, phase="awaiting_human", state=steps.JsonText(parked.model_dump_json()),
        new_turns=[],
    )).saved  # fmt: skip
    store.flush()
    answered = parked.model_copy(deep=True)
    answered.phase, answered.prompt = "ready", None
    # A call reporting more tokens than 64 bits hold: SQLite cannot store its row.
    huge = Usage(prompt_tokens=10**20, completion_tokens=1, total_tokens=10**20 + 1)
    call = AgentCallRecord(role="validator", agent="j", latency_ms=1, usage=huge)
    skipped = TurnResult(turn=1, input=None, status="skipped", skip_reason="x", calls=[call])
    assert store.save_step(steps.Step(
        **common, phase="ready", state=steps.JsonText(answered.model_dump_json()),
        new_turns=[skipped], expected_phase="awaiting_human",
    )).saved  # fmt: skip

    store.flush()  # written again step by step: the reply refused, nothing raised
    (refused,) = store.take_refused()
    assert (refused.case_id, refused.turn, refused.ended_as) == ("T001", 1, None)
    assert "too large" in refused.reason
    loaded = store.load_case(run_id, "T001")
    assert loaded is not None and loaded.phase == "awaiting_human", "back to waiting"

    ended = end_refused(store, run_id, "T001", refused.turn, refused.reason)
    assert (ended.saved, ended.case_done, ended.status) == (True, True, "failed")
    store.flush()
    assert store.take_refused() == []
    row = case_rows(db, run_id)["T001"]
    assert (row.phase, row.status) == ("done", "failed")
    assert row.result is not None
    assert row.result["error"].startswith("turn 1 could not be stored: ")
    assert results.count_turn_rows(db, run_id) == []
    run = runs.get_run(db, run_id)
    assert run is not None and (run.finished_cases, run.failed) == (1, 1)


def test_report_and_status_of_a_run_not_finished_say_so(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A nightly job that publishes `report RUN` too early must not pass quietly; a run
    still being stored does not know its number of cases."""
    db, run_id = stored_suite()
    assert step(db, run_id, "T001", 1).saved
    capsys.readouterr()
    code = main(["report", run_id, "--format", "junit", "-o", "early.xml"])
    _, err = capsys.readouterr()
    assert code == 1
    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "running"
    assert f"run {run_id} is running (0/4 cases finished): the report covers only" in err
    assert main(["status", run_id]) == 0
    out, _ = capsys.readouterr()
    assert "turns     0 in finished cases, 1 played\n" in out

    pending = steps.new_run_id()
    runs.create_run(db, run_id=pending, agent=None, input_label="x", options={}, config={})
    capsys.readouterr()
    assert main(["status", pending]) == 0
    out, _ = capsys.readouterr()
    assert "status    pending" in out and "cases     0/? finished" in out


def test_an_embedded_run_whose_store_cannot_be_opened_stops_with_the_reason(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (demo / "a-file").write_text("not a directory")
    monkeypatch.setenv("AGENTTEST_DATABASE_URL", f"sqlite:///{demo}/a-file/runs.db")
    code, out, err = run_suite(capsys)
    assert code == 3, (out, err)
    assert f"File exists: '{demo}/a-file'" in err
    assert "Traceback" not in err
    assert "Unclosed client session" not in err, "the agent connections were closed"


# -- resume --------------------------------------------------------------------------------


def test_resume_finishes_conversations_left_unfinished(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, run_id = stored_suite()
    # The submitter died mid-run: T001 is at turn 2, T004 finished, T002/T003 never started.
    assert step(db, run_id, "T001", 1).next_turn == 2
    assert step(db, run_id, "T004", 1).case_done
    rows = case_rows(db, run_id)
    assert (rows["T001"].phase, rows["T001"].next_turn) == ("ready", 2)
    assert rows["T004"].phase == "done"

    capsys.readouterr()
    assert main(["status", run_id]) == 0
    assert "cases     1/4 finished: 0 passed, 1 failed, 0 skipped" in capsys.readouterr().out

    code = main(["resume", run_id])
    out, err = capsys.readouterr()
    assert code == 1, "a resumed run exits like a run: a case failed"
    assert f"run {run_id}: resuming 3 unfinished conversation(s)" in err
    assert "Failed:  1\n" in out and "Passed:  2\n" in out

    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "done"
    records = check_store_matches_results(db, run_id)
    assert [r.status for r in records] == ["passed", "skipped", "passed", "failed"]
    t001 = records[0]
    assert [t.input for t in t001.turns] == [
        "I want to submit an expense",
        "Business travel, $3500",
        "Yes, confirm",
    ]
    assert results.get_report(db, run_id, "jsonl") is not None

    assert main(["resume", run_id]) == 0
    assert "is complete; nothing to resume" in capsys.readouterr().err


def test_resume_of_a_reset_conversation_reruns_from_its_turn(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run_suite(capsys)
    run_id = RUN_ID.search(out).group(1)  # type: ignore[union-attr]
    db = url()
    # Undo T004 entirely, as if its only turn had never been recorded.
    with session_scope(db) as session:
        session.execute(
            update(CaseRow)
            .where(CaseRow.run_id == run_id, CaseRow.case_id == "T004")
            .values(phase="pending", next_turn=1, state=None, status=None, result=None)
        )
        session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(
                status="running",
                finished_cases=RunRow.finished_cases - 1,
                failed=RunRow.failed - 1,
                total_turns=RunRow.total_turns - 1,
            )
        )
        session.query(TurnRow).filter(TurnRow.run_id == run_id, TurnRow.case_id == "T004").delete()
        session.query(RunReportRow).filter(RunReportRow.run_id == run_id).delete()

    capsys.readouterr()
    assert main(["resume", run_id]) == 1
    assert "resuming 1 unfinished conversation(s)" in capsys.readouterr().err
    records = check_store_matches_results(db, run_id)
    assert records[3].status == "failed"
    assert runs.get_run(db, run_id).status == "done"  # type: ignore[union-attr]


def test_resume_answers_a_conversation_left_waiting_for_a_person(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An --interactive run whose submitter died while asking: resumed without a terminal,
    on_missing_input decides (the case is skipped, the run completes)."""
    db, run_id = stored_suite(RunOptions(target="assistants.expense", interactive=True))
    assert step(db, run_id, "T002", 1).awaiting_human
    assert case_rows(db, run_id)["T002"].phase == "awaiting_human"

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    main(["resume", run_id])
    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "done", capsys.readouterr()
    records = check_store_matches_results(db, run_id)
    t002 = records[1]
    assert t002.status == "skipped"
    assert t002.skip_reason is not None and "awaiting input" in t002.skip_reason


def test_resume_redoes_a_lost_aggregation(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The aggregator died after claiming the run: `resume` aggregates it after all."""
    db, run_id = stored_suite()
    asyncio.run(drive(db, run_id, [(f"T00{i}", 1) for i in range(1, 5)], 4, Progress(4)))
    assert results.claim_aggregation(db, run_id)  # ...and then the process died
    assert aggregate(db, run_id) is None
    capsys.readouterr()
    main(["resume", run_id])
    run = runs.get_run(db, run_id)
    assert run is not None and run.status == "done"
    assert results.get_report(db, run_id, "jsonl") is not None


def test_last_is_the_newest_run_even_within_one_second(demo: Path) -> None:
    db = url()
    from agenttest_worker.store.sql.db import upgrade

    upgrade(db)
    # Run ids sort by second, then randomly: the newer run may sort first.
    for run_id in ("20990101-000000-ffffff", "20990101-000000-000000"):
        runs.create_run(db, run_id=run_id, agent=None, input_label="x", options={}, config={})
    latest = runs.latest_run(db)
    assert latest is not None and latest.id == "20990101-000000-000000"


# -- the same rows on both databases ---------------------------------------------------------


def _stored_rows(db: str, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    from agenttest_worker.store.sql.models import AgentCallRow, AssertionResultRow

    with session_scope(db) as session:
        turns = session.scalars(select(TurnRow).where(TurnRow.run_id == run_id)).all()
        verdicts = session.scalars(
            select(AssertionResultRow).where(AssertionResultRow.run_id == run_id)
        ).all()
        calls = session.scalars(select(AgentCallRow).where(AgentCallRow.run_id == run_id)).all()
        return {
            "turns": sorted(
                (
                    t.case_id,
                    t.turn,
                    t.input,
                    t.input_source,
                    t.output,
                    json.dumps(t.tool_calls, sort_keys=True),
                    t.awaiting_input,
                    t.status,
                    t.error,
                    t.skip_reason,
                )
                for t in turns
            ),
            "assertions": sorted(
                (a.case_id, a.turn, a.position, a.type, a.passed, a.reason, a.detail["type"])
                for a in verdicts
            ),
            "calls": sorted(
                (
                    c.case_id,
                    c.turn,
                    c.position,
                    c.role,
                    c.agent,
                    c.attempts,
                    c.status_code,
                    c.prompt_tokens,
                    c.completion_tokens,
                    c.total_tokens,
                    c.error,
                )
                for c in calls
            ),
        }


def test_postgres_and_sqlite_store_the_same_rows_for_each_step(
    demo: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step is saved by one statement on Postgres and by a transaction of several on
    SQLite: every turn, assertion and agent call row comes out the same, once."""
    stored: list[dict[str, list[tuple[Any, ...]]]] = []
    for database in (None, pg_database):
        if database is not None:
            monkeypatch.setenv("AGENTTEST_DATABASE_URL", database)
        db, run_id = stored_suite()
        for case_id in case_rows(db, run_id):
            turn: int | None = 1
            while turn is not None:
                advance = step(db, run_id, case_id, turn)
                assert advance.saved, (case_id, turn)
                # The same step again (a duplicate message) saves nothing.
                assert not step(db, run_id, case_id, turn).saved
                turn = advance.next_turn
        check_store_matches_results(db, run_id)
        stored.append(_stored_rows(db, run_id))
    embedded, postgres = stored
    assert embedded == postgres
    assert len(postgres["turns"]) >= 8
    assert {row[3] for row in postgres["assertions"]} >= {"contains", "agent"}
    assert {row[3] for row in postgres["calls"]} >= {"target", "validator", "simulator"}


def test_the_step_statements_insert_every_column_the_row_builders_fill() -> None:
    from agenttest_worker.results import AgentCallRecord, AssertionResult, TurnResult
    from agenttest_worker.store.sql.models import AgentCallRow, AssertionResultRow, TurnRecordRow

    verdict = AssertionResult(type="contains", passed=True, reason="ok")
    call = AgentCallRecord(role="target", agent="a", latency_ms=1)
    built = {
        TurnRow: steps.turn_rows("r", "c", [TurnResult(turn=1, status="passed")]),
        AssertionResultRow: steps.assertion_rows("r", "c", 1, [verdict]),
        AgentCallRow: steps.call_rows("r", "c", 1, [call]),
    }
    for model, rows in built.items():
        names = tuple(name for name, _ in turn_statements.ROW_COLUMNS[model.__tablename__])
        assert tuple(rows[0]) == names, model.__name__
    for model in (*built, TurnRecordRow):
        names = tuple(name for name, _ in turn_statements.ROW_COLUMNS[model.__tablename__])
        assert set(names) <= set(model.__table__.columns.keys()), model.__name__


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_turn_read_names_its_columns_in_order(
    dialect: str, pg_database: str, tmp_path: Path
) -> None:
    from sqlalchemy import text

    from agenttest_worker.store.sql.db import get_engine

    database = pg_database if dialect == "postgresql" else f"sqlite:///{tmp_path / 'read.db'}"
    upgrade(database)
    with get_engine(database).connect() as connection:
        read = connection.execute(
            text(turn_statements.load(dialect)), {"b_run": "r", "b_case": "c", "b_known": None}
        )
        assert list(read.keys()) == list(turn_statements.LoadedRow._fields)
