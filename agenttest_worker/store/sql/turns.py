"""The turn's hot path: loading a conversation and saving one step of it, exactly once.

Writes are idempotent on (run, case, turn): `save_step` moves a conversation on only
if it is still at the turn the task ran (a guarded UPDATE), and inserts its rows with
ON CONFLICT DO NOTHING. So a redelivered task, or the same task run twice at once,
records each turn exactly once; the loser's work is discarded. A conversation that
ends bumps its run's counters in the same transaction, and the caller that sees the
last one finish enqueues the aggregator, which claims the run once (results.py).

Both take the engine rather than its URL: `base.SqlStore` holds it, and a test passes a
faulty one in. The statements are SQL text (turn_statements.py). On Postgres they run
through psycopg on a pooled connection in autocommit, each one atomic (a step's save is
one statement); elsewhere, and for a step that releases a budget reservation, through
SQLAlchemy's `text()` (a step's save is then one transaction of several statements).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

from sqlalchemy import Connection, TextClause, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from agenttest_worker.results import CaseResult
from agenttest_worker.store import repetition_chain
from agenttest_worker.store.sql import budget_reservations as budget
from agenttest_worker.store.sql import turn_statements as sql
from agenttest_worker.store.sql.db import connection_lost, reconnecting, retrying
from agenttest_worker.store.steps import (
    JsonDocument,
    LoadedCase,
    RepeatPlan,
    Saved,
    Step,
    StepRows,
    claimed,
    record_rows,
    step_rows,
    step_spend,
)
from agenttest_worker.store.storable import dumps_storable, storable_json, storable_row

# psycopg is imported where it is used, on Postgres only: an embedded (SQLite) run never
# needs it.


@cache
def _text(statement: str) -> TextClause:
    return text(statement)


class _Statements:
    """Runs the step's statements on one connection, each returning its first row:
    through psycopg on a pooled Postgres connection (`pooled`), else through
    SQLAlchemy's `text()` on `connection`."""

    def __init__(self, connection: Connection | None = None, pooled: Any = None) -> None:
        self.connection = connection
        self.pooled = pooled

    def fetch_one(self, statement: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        if self.connection is not None:
            found = self.connection.execute(_text(statement), dict(params)).first()
            return None if found is None else tuple(found)
        import psycopg  # Postgres only (see the imports above)

        driver = self.pooled.driver_connection
        try:
            with driver.cursor() as cursor:
                cursor.execute(sql.for_psycopg(statement), params)
                row = cursor.fetchone()
        except psycopg.Error as exc:
            # SQLAlchemy's shape, as for any other statement: `reconnecting` (db.py)
            # retries a lost connection, and the pool drops it.
            lost = connection_lost(exc) or driver.closed
            if lost:
                self.pooled.invalidate(exc)
            error = DBAPIError.instance(
                statement, None, exc, psycopg.Error, connection_invalidated=lost
            )
            raise error from exc
        return None if row is None else tuple(row)


@contextmanager
def _autocommit(engine: Engine) -> Iterator[_Statements]:
    """A connection for the turn's statements, each committed on its own: on Postgres a
    pooled psycopg connection, given back to the pool in its usual mode (the sessions
    that check it out next expect transactions); elsewhere a SQLAlchemy connection."""
    if engine.dialect.name != "postgresql":
        with engine.connect() as plain:
            yield _Statements(plain.execution_options(isolation_level="AUTOCOMMIT"))
        return
    import psycopg  # Postgres only (see the imports above)

    try:
        pooled = engine.raw_connection()
    except psycopg.Error as exc:  # cannot connect: the same error `engine.connect()` raises
        raise DBAPIError.instance(None, None, exc, psycopg.Error) from exc
    try:
        driver: Any = pooled.driver_connection
        driver.autocommit = True  # psycopg's own flag: no round trip
        yield _Statements(pooled=pooled)
    finally:
        if pooled.is_valid:
            try:
                driver.autocommit = False
            except psycopg.Error as exc:  # e.g. broken mid-statement: not reusable
                pooled.invalidate(exc)
        pooled.close()


# What a run was created with never changes: read once per process and run.
_settings_cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
_settings_lock = threading.Lock()


def _run_settings(connection: _Statements, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with _settings_lock:
        cached = _settings_cache.get(run_id)
    if cached is None:
        found = connection.fetch_one(sql.RUN_SETTINGS, {"b_run": run_id})
        if found is None:
            raise LookupError(f"run {run_id} is not in the store")
        cached = (json.loads(found[0]), json.loads(found[1]))
        with _settings_lock:
            if len(_settings_cache) > 64:
                _settings_cache.clear()
            _settings_cache[run_id] = cached
    return cached


@reconnecting
def load_case(
    engine: Engine,
    run_id: str,
    case_id: str,
    count_delivery: bool = False,
    turn: int | None = None,
    known: str | None = None,
) -> LoadedCase | None:
    """The conversation and what its run says; optionally counting this delivery.

    With `turn`, only a delivery of the turn the conversation is waiting for counts: a
    duplicate or stale message must not use up the next turn's delivery budget.
    `known`: the token of the step whose state this process kept (kept_states.py); if
    the row still holds it, its state is not read (`LoadedCase.state_kept`).
    """
    keys = {"b_run": run_id, "b_case": case_id}
    with _autocommit(engine) as connection:
        found = connection.fetch_one(sql.load(engine.dialect.name), {**keys, "b_known": known})
        if found is None:
            return None
        row = sql.LoadedRow(*found)
        deliveries = row.deliveries
        current = turn is None or (row.next_turn == turn and row.phase in ("pending", "ready"))
        if count_delivery and current:
            waiting = row.next_turn if turn is None else turn
            counted = connection.fetch_one(sql.COUNT_DELIVERY, {**keys, "b_turn": waiting})
            if counted is not None:
                deliveries = counted[0]
        options, config = _run_settings(connection, run_id)
        return LoadedCase(
            run_id=run_id,
            case_id=case_id,
            case=row.case,
            agent=row.agent,
            phase=row.phase,
            next_turn=row.next_turn,
            state=row.state,
            deliveries=deliveries,
            run_cancelled=bool(row.cancelled),  # SQLite's is 0 or 1
            cancel_reason=row.cancel_reason,
            run_options=options,
            run_config=config,
            deadline_at=row.deadline_at,
            run_tokens=row.total_tokens,
            run_cost=row.total_cost,
            run_complete=row.run_status == "running" and row.finished_cases >= row.total_cases,
            step_token=row.step_token,
            state_kept=known is not None and row.step_token == known,
            turn_records=None if row.records is None else f"[{row.records}]",
            turn_messages=None if row.messages is None else f"[{row.messages}]",
        )


# (run, case, turn, token) of the step this thread is writing, kept across its retries.
_written = threading.local()


def _landed(connection: _Statements, step: tuple[str, str, int]) -> bool:
    """Whether this thread's previous attempt at `step` committed after all.

    The connection can drop after the server committed but before it said so. Every
    attempt of one step writes the same random token with the step; if the row holds
    it, the write is ours (a concurrent copy of the turn, or anything since, writes
    another).
    """
    known = getattr(_written, "step", None)
    if known is None or known[:3] != step:
        return False
    found = connection.fetch_one(sql.CASE_TOKEN, {"b_run": step[0], "b_case": step[1]})
    return found is not None and found[0] == known[3]


def _run_complete(connection: _Statements, run_id: str) -> bool:
    found = connection.fetch_one(sql.RUN_COUNTS, {"b_run": run_id})
    if found is None:
        return False
    finished, total, status = found
    return bool(status == "running" and finished >= total)


@reconnecting
def save_step(engine: Engine, step: Step) -> Saved:
    """Record one step of a conversation, exactly once (see the module docstring).

    Retried by `reconnecting` when the connection drops. If it dropped after the write
    landed, the retry finds the guard moved on by its own write (the step's token) and
    reports the step saved, so that the caller still enqueues the next turn; any other
    write it finds there (a duplicate's) is not saved.

    `step.spend` (tokens, cost) is added to the run's totals with the step, and the
    conversation's reservation released (budget_reservations.py): runs with a budget account
    per turn, so the next turn anywhere in the fleet sees it. Without,
    tokens and cost are added once per case when it ends (one write to the run row per case).
    """
    key = (step.run_id, step.case_id, step.expected_turn)
    known = getattr(_written, "step", None)
    if not retrying() or known is None or known[:3] != key:
        # A first attempt: nothing of this call was written yet.
        _written.step = known = (*key, secrets.token_hex(16))
    postgres = engine.dialect.name == "postgresql"
    result = step.result
    # The phases the conversation may be in (turn_statements.SAVE_GUARDED): running, or
    # parked where a person's reply is what is being saved.
    phases = ("pending", "ready") if step.expected_phase is None else (step.expected_phase,) * 2
    params: dict[str, Any] = {
        "b_run": step.run_id,
        "b_case": step.case_id,
        "b_turn": step.expected_turn,
        "b_from": phases[0],
        "b_or_from": phases[1],
        "b_next": step.next_turn,
        "b_phase": step.phase,
        "b_state": _json_text(step.state, postgres),
        "b_status": result.status if result else None,
        "b_result": None if result is None else _json_text(result.model_dump_json(), postgres),
        "b_token": known[3],
        "b_stop": step.stop_run,
        "b_turns": result.total_turns if result else 0,
        "b_passed": int(result is not None and result.status == "passed"),
        "b_failed": int(result is not None and result.status == "failed"),
        "b_skipped": int(result is not None and result.status == "skipped"),
        "b_chained": 0,
    }
    tokens, cost = step_spend(step.spend, result)
    params.update(b_tokens=tokens, b_cost=cost)
    rows = step_rows(step.run_id, step.case_id, step.new_turns, step.final_assertions)
    rows.records = record_rows(step)

    # A budgeted step also releases its conversation's reservation (budget_reservations.py):
    # that takes the transaction below, and Postgres's one-statement save is kept for
    # steps without a budget, the hot path. So is the end of a repetition of --repeat
    # auto, which may add the next (`_chain`).
    if postgres and not step.budgeted and step.repeat_plan is None:
        params.update(
            b_ended=result is not None,
            b_spent=result is None and bool(tokens or cost),
            **{
                sql.ROWS_PARAM[table]: dumps_storable(table_rows)
                for table, table_rows in _by_table(rows).items()
            },
        )
        with _autocommit(engine) as connection:
            row = connection.fetch_one(sql.POSTGRES_SAVE, params)
            if row is None:
                return _not_moved(connection, key, result)
        if result is None:
            return Saved(True, token=known[3])
        _, finished, total, status, claimed_from, started = row
        return Saved(
            True,
            run_finished=status == "running" and finished >= total,
            starts=claimed(claimed_from, started),
            token=known[3],
        )

    with engine.begin() as connection:
        if not connection.execute(_text(sql.SAVE_GUARDED), params).rowcount:
            return _not_moved(_Statements(connection), key, result)
        insert_step_rows(connection, rows)
        if step.budgeted:
            budget.release(connection, step.run_id, step.case_id, step.budget_turns)
        if result is None:
            if tokens or cost:
                connection.execute(_text(sql.SPEND), params)
            return Saved(True, token=known[3])
        connection.execute(_text(sql.FORGET_RECORDS), params)
        added = None if step.repeat_plan is None else _chain(connection, step, step.repeat_plan)
        params["b_chained"] = int(added is not None)
        finished, total, status, claimed_from, started = connection.execute(
            _text(sql.CASE_ENDED), params
        ).one()
        return Saved(
            True,
            run_finished=status == "running" and finished >= total,
            starts=claimed(claimed_from, started),
            token=known[3],
            added=added,
        )


def _chain(connection: Connection, step: Step, plan: RepeatPlan) -> str | None:
    """Add the next repetition of the step's case when its stored ones ask for it
    (store/repetition_chain.py), in the step's transaction; its key, or None."""
    keys = {"b_run": step.run_id, "b_case": step.case_id}
    # On Postgres every step ending a repetition of this run waits here for the one
    # before to commit, and so reads its end below. A run stopping starts nothing.
    lock = sql.LOCK_RUN if connection.dialect.name == "postgresql" else sql.RUN_STOPPING
    if step.stop_run is not None or connection.execute(_text(lock), keys).scalar_one():
        return None
    found = connection.execute(_text(sql.REPETITIONS), {**keys, "b_test": plan.test_id})
    key = repetition_chain.next_key(plan, {row[0]: row[1] for row in found})
    if key is None:
        return None
    case = connection.execute(_text(sql.CASE_TEXT), keys).scalar_one()
    record = repetition_chain.successor_text(case, key, plan)
    statement = sql.add_repetition(connection.dialect.name)
    params = {**keys, "b_key": key, "b_record": record}
    added = connection.execute(_text(statement), params).rowcount
    return key if added else None


def _by_table(rows: StepRows) -> dict[str, list[dict[str, Any]]]:
    return {
        "turns": rows.turns,
        "assertion_results": rows.verdicts,
        "agent_calls": rows.calls,
        "turn_records": rows.records,
    }


def insert_step_rows(connection: Connection, rows: StepRows) -> None:
    """A step's (or a batch of steps') turn, assertion, agent-call and turn-record rows,
    each inserted once (turn_statements.INSERT), in `connection`'s transaction."""
    postgres = connection.dialect.name == "postgresql"
    for table, table_rows in _by_table(rows).items():
        if table_rows:
            written = [_insertable(row, postgres) for row in table_rows]
            connection.execute(_text(sql.INSERT[table]), written)


def _insertable(row: dict[str, Any], postgres: bool) -> dict[str, Any]:
    """`row` as its INSERT binds it: JSON values as their text, and on Postgres no NUL
    character in any text (storable.py)."""
    if postgres:
        row = storable_row(row)
    return {
        name: (dumps_storable(value) if postgres else json.dumps(value))
        if name in sql.JSON_COLUMNS
        else value
        for name, value in row.items()
    }


def _json_text(document: JsonDocument, postgres: bool) -> str:
    """A JSON document as the text its column is written with (storable on Postgres)."""
    written = document if isinstance(document, str) else json.dumps(document)
    return storable_json(written) if postgres else written


def _not_moved(
    connection: _Statements, step: tuple[str, str, int], result: CaseResult | None
) -> Saved:
    if retrying() and _landed(connection, step):
        # The first attempt committed and the connection dropped before the commit was
        # acknowledged: this step is saved, and its caller must still enqueue what
        # follows (else the conversation waits for the sweeper).
        finished = result is not None and _run_complete(connection, step[0])
        return Saved(True, run_finished=finished, token=_written.step[3])
    return Saved(False)
