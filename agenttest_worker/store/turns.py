"""The turn's hot path: loading a conversation and saving one step of it, exactly once.

Writes are idempotent on (run, case, turn): `save_step` moves a conversation on only
if it is still at the turn the task ran (a guarded UPDATE), and inserts its rows with
ON CONFLICT DO NOTHING. So a redelivered task, or the same task run twice at once,
records each turn exactly once; the loser's work is discarded. A conversation that
ends bumps its run's counters in the same transaction, and the caller that sees the
last one finish enqueues the aggregator, which claims the run once (results.py).

Both take the engine rather than its URL: `base.SqlStore` holds it, and a test passes a
faulty one in. The statements are in turn_statements.py, the connection they run on in
hot_path.py.
"""

from __future__ import annotations

import json
import secrets
import threading
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.engine import Engine

from agenttest_worker.results import CaseResult
from agenttest_worker.store import budget
from agenttest_worker.store import turn_statements as sql
from agenttest_worker.store.db import reconnecting, retrying
from agenttest_worker.store.hot_path import (
    SqlAlchemyTurnConnection,
    TurnConnection,
    turn_connection,
)
from agenttest_worker.store.steps import (
    JsonDocument,
    JsonText,
    LoadedCase,
    Saved,
    Step,
    as_object,
    claimed,
    record_rows,
    step_rows,
    step_spend,
)


def _turn_connection(engine: Engine) -> AbstractContextManager[TurnConnection]:
    return turn_connection(engine, sql.JSON_PARAMS)


# What a run was created with never changes: read once per process and run.
_settings_cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
_settings_lock = threading.Lock()


def _run_settings(connection: TurnConnection, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with _settings_lock:
        cached = _settings_cache.get(run_id)
    if cached is None:
        found = connection.fetch_one(sql.RUN_SETTINGS, {"b_run": run_id})
        if found is None:
            raise LookupError(f"run {run_id} is not in the store")
        cached = (found[0], found[1])
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
    load = sql.load_statement(engine.dialect.name)
    with _turn_connection(engine) as connection:
        found = connection.fetch_one(load, {"b_run": run_id, "b_case": case_id, "b_known": known})
        if found is None:
            return None
        row = sql.LoadedRow(*found)
        deliveries = row.deliveries
        current = turn is None or (row.next_turn == turn and row.phase in ("pending", "ready"))
        if count_delivery and current:
            counted = connection.fetch_one(
                sql.COUNT_DELIVERY,
                {
                    "b_run": run_id,
                    "b_case": case_id,
                    "b_turn": row.next_turn if turn is None else turn,
                },
            )
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
            run_cancelled=row.cancelled,
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


def _landed(connection: TurnConnection, step: tuple[str, str, int]) -> bool:
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


def _run_complete(connection: TurnConnection, run_id: str) -> bool:
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
    conversation's reservation released (store/budget.py): runs with a budget account
    per turn, so the next turn anywhere in the fleet sees it. Without,
    tokens are added once per case when it ends (one write to the run row per case).
    """
    key = (step.run_id, step.case_id, step.expected_turn)
    known = getattr(_written, "step", None)
    if not retrying() or known is None or known[:3] != key:
        # A first attempt: nothing of this call was written yet.
        _written.step = known = (*key, secrets.token_hex(16))
    # A budgeted step also releases its conversation's reservation (store/budget.py):
    # that takes the transaction below, and Postgres's one-statement save is kept for
    # steps without a budget, the hot path.
    postgres = engine.dialect.name == "postgresql" and not step.budgeted
    result = step.result
    params: dict[str, Any] = {
        "b_run": step.run_id,
        "b_case": step.case_id,
        "b_turn": step.expected_turn,
        "b_next": step.next_turn,
        "b_phase": step.phase,
        # Postgres takes JSON text as it is (the hot path sends it as jsonb); elsewhere
        # the JSON column type writes the objects itself.
        "b_state": _json_text(step.state) if postgres else as_object(step.state),
        "b_status": result.status if result else None,
        "b_token": known[3],
    }
    if result is None:
        params["b_result"] = None
    elif postgres:
        params["b_result"] = JsonText(result.model_dump_json())
    else:
        params["b_result"] = result.model_dump(mode="json")
    if step.expected_phase is not None:
        params["b_expected_phase"] = step.expected_phase
    rows = step_rows(step.run_id, step.case_id, step.new_turns, step.final_assertions)
    rows.records = record_rows(step)
    tokens, cost = step_spend(step.spend, result)
    if result is not None:
        params.update(
            b_stop=step.stop_run,
            b_turns=result.total_turns,
            b_passed=int(result.status == "passed"),
            b_failed=int(result.status == "failed"),
            b_skipped=int(result.status == "skipped"),
        )
    params.update(b_tokens=tokens, b_cost=cost)

    if postgres:
        statement = sql.pg_step(
            step.expected_phase is not None,
            bool(rows.turns),
            bool(rows.verdicts),
            bool(rows.calls),
            result is not None,
            bool(tokens or cost),
            bool(rows.records),
        )
        params.update(
            b_turn_rows=rows.turns,
            b_verdict_rows=rows.verdicts,
            b_call_rows=rows.calls,
            b_record_rows=rows.records,
        )
        with _turn_connection(engine) as connection:
            row = connection.fetch_one(statement, params)
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
        guard = sql.save_guard(step.expected_phase is not None)
        if not connection.execute(guard, params).rowcount:
            return _not_moved(SqlAlchemyTurnConnection(connection), key, result)
        sql.insert_step_rows(connection, rows)
        if step.budgeted:
            budget.release(connection, step.run_id, step.case_id, step.budget_turns)
        if result is None:
            if tokens or cost:
                connection.execute(sql.SPEND, params)
            return Saved(True, token=known[3])
        connection.execute(sql.FORGET_RECORDS, params)
        finished, total, status, claimed_from, started = connection.execute(
            sql.CASE_ENDED, params
        ).one()
        return Saved(
            True,
            run_finished=status == "running" and finished >= total,
            starts=claimed(claimed_from, started),
            token=known[3],
        )


def _json_text(document: JsonDocument) -> JsonText:
    if isinstance(document, JsonText):
        return document
    if isinstance(document, str):
        return JsonText(document)
    return JsonText(json.dumps(document))


def _not_moved(
    connection: TurnConnection, step: tuple[str, str, int], result: CaseResult | None
) -> Saved:
    if retrying() and _landed(connection, step):
        # The first attempt committed and the connection dropped before the commit was
        # acknowledged: this step is saved, and its caller must still enqueue what
        # follows (else the conversation waits for the sweeper).
        finished = result is not None and _run_complete(connection, step[0])
        return Saved(True, run_finished=finished, token=_written.step[3])
    return Saved(False)
