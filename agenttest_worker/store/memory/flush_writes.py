"""Writing a flush of the embedded store (a `FlushBatch`) to the database.

Run on the embedded store's thread. It returns what the database refused; the caller
(BufferedStore.flush) takes those steps back in memory.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

from sqlalchemy import Connection, Text, Update, bindparam, text, update

from agenttest_worker.store import steps
from agenttest_worker.store.memory.flush_batch import (
    CaseValues,
    FlushBatch,
    RunTotals,
    StepRefused,
    take_off,
)
from agenttest_worker.store.sql.db import get_engine, unstorable_reason
from agenttest_worker.store.sql.shared import CASES, JSON_OR_NULL, RUNS
from agenttest_worker.store.sql.turn_statements import add_repetition
from agenttest_worker.store.sql.turns import insert_step_rows
from agenttest_worker.store.sql.unplayed import end_unplayed
from agenttest_worker.store.sql.usage import add_run_usage_on


def write_flush(url: str, batch: FlushBatch) -> list[StepRefused]:
    """Write `batch` in one transaction; what the database refused, if anything.

    When the database refuses a value one of the steps holds (db.unstorable_reason),
    the steps are written again one by one, each in a savepoint: the others are
    written, and for each conversation with a refused step the step refused (and so
    the ones after it) is returned, its row left as the step before it left it. Any
    other error is raised, and nothing was written.
    """
    try:
        _write_whole(url, batch)
    except Exception as exc:
        if unstorable_reason(exc) is None:
            raise
        return _write_each(url, batch)
    return []


@cache
def _flush_case(sqlite: bool) -> Update:
    """The conversations' UPDATE. SQLite gets the state and the record as pydantic's text:
    parsing it for the JSON type to write it again was most of a flush's CPU."""
    json_type = Text() if sqlite else JSON_OR_NULL
    return (
        update(CASES)
        .where(CASES.c.run_id == bindparam("b_run"), CASES.c.case_id == bindparam("b_case"))
        .values(
            next_turn=bindparam("b_next"),
            phase=bindparam("b_phase"),
            state=bindparam("b_state", type_=json_type),
            status=bindparam("b_status"),
            result=bindparam("b_result", type_=json_type),
            deliveries=0,
        )
    )


def _write_whole(url: str, batch: FlushBatch) -> None:
    rows = steps.StepRows.none()
    for case in batch.cases:
        for step in case.steps:
            rows.add(step.rows)
    with get_engine(url).begin() as connection:
        _add_conversations(connection, batch)
        if batch.cases:
            sqlite = connection.dialect.name == "sqlite"
            connection.execute(
                _flush_case(sqlite),
                [_case_values(batch.run_id, c.case_id, c.now, sqlite) for c in batch.cases],
            )
        insert_step_rows(connection, rows)
        _write_run(connection, batch, batch.run)


def _write_each(url: str, batch: FlushBatch) -> list[StepRefused]:
    refused: list[StepRefused] = []
    run = copy.deepcopy(batch.run)
    with get_engine(url).begin() as connection:
        _add_conversations(connection, batch)
        sqlite = connection.dialect.name == "sqlite"
        for case in batch.cases:
            for index, step in enumerate(case.steps):
                try:
                    with connection.begin_nested():
                        values = _case_values(batch.run_id, case.case_id, step.values(), sqlite)
                        connection.execute(_flush_case(sqlite), [values])
                        insert_step_rows(connection, step.rows)
                except Exception as exc:
                    reason = unstorable_reason(exc)
                    if reason is None:
                        raise
                    refused.append(StepRefused(case.case_id, index, reason))
                    take_off(run, case.steps[index:])
                    break
        # The refused steps taken off: the run's counters without them.
        _write_run(connection, batch, run)
    return refused


def _add_conversations(connection: Connection, batch: FlushBatch) -> None:
    """The conversations added since the last flush (buffered_run.RunChanges.added),
    before the steps that move them are written."""
    statement = text(add_repetition(connection.dialect.name))
    for key, source, record in batch.changes.added:
        values = {"b_run": batch.run_id, "b_key": key, "b_case": source, "b_record": record}
        connection.execute(statement, values)


def _case_values(run_id: str, case_id: str, now: CaseValues, sqlite: bool) -> dict[str, Any]:
    record = now.result
    return {
        "b_run": run_id,
        "b_case": case_id,
        "b_next": now.next_turn,
        "b_phase": now.phase,
        "b_state": _json_value(now.state, sqlite),
        "b_status": record.status if record is not None else None,
        "b_result": _json_value(record.text, sqlite) if record is not None else None,
    }


def _write_run(connection: Connection, batch: FlushBatch, run: RunTotals) -> None:
    values: dict[str, Any] = {
        "finished_cases": run.finished_cases,
        "total_tokens": run.total_tokens,
        "total_cost": run.total_cost,
        **run.counters,
    }
    changes = batch.changes
    if changes.cancel is not None:
        values.update(cancelled=True, cancel_reason=changes.cancel)
    connection.execute(update(RUNS).where(RUNS.c.id == batch.run_id).values(**values))
    if changes.unplayed is not None:
        # After the steps of this flush: a conversation started holds its own record.
        unplayed = changes.unplayed
        end_unplayed(connection, batch.run_id, unplayed.from_seq, unplayed.reason)
    # Only calls of steps played but not saved are added here (buffered_run.RunChanges).
    add_run_usage_on(connection, batch.run_id, changes.usage, unsaved=True)


def _json_value(document: steps.JsonDocument | None, sqlite: bool) -> Any:
    """A JSON document as _flush_case binds it: text on SQLite, objects elsewhere."""
    if not sqlite:
        return steps.as_object(document)
    if document is None or isinstance(document, str):
        return document
    return json.dumps(document)
