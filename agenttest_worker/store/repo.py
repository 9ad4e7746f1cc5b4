"""Reading and writing runs, conversations and results: every query the system makes.

Writes are idempotent on (run, case, turn): `save_step` moves a conversation on only
if it is still at the turn the task ran (a guarded UPDATE), and inserts its rows with
ON CONFLICT DO NOTHING. So a redelivered task, or the same task run twice at once,
records each turn exactly once; the loser's work is discarded. A conversation that
ends bumps its run's counters in the same transaction, and the caller that sees the
last one finish enqueues the aggregator, which claims the run once.
"""

from __future__ import annotations

import getpass
import json
import secrets
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import (
    JSON,
    ColumnElement,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    column,
    delete,
    func,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from agenttest_worker.results import AssertionResult, CaseResult, TurnResult
from agenttest_worker.settings import get_settings
from agenttest_worker.store.db import get_engine, reconnecting, retrying, session_scope
from agenttest_worker.store.hot_path import (
    JsonKind,
    SqlAlchemyTurnConnection,
    TurnConnection,
    turn_connection,
)
from agenttest_worker.store.models import (
    AgentCallRow,
    AssertionResultRow,
    Base,
    CaseRow,
    RunReportRow,
    RunRow,
    TurnRow,
)
from agenttest_worker.store.report_copy import copy_reports
from agenttest_worker.store.steps import (
    JsonDocument,
    JsonText,
    LoadedCase,
    Saved,
    StepRows,
    as_object,
    step_rows,
    step_spend,
)
from agenttest_worker.store.storable import storable_row


def submitted_by() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _insert(session: Session, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect of the session's database."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    module: Any = postgresql if dialect == "postgresql" else sqlite
    # One statement executed for many rows (not a VALUES list per call): its compiled
    # form is cached, so a turn's inserts cost no SQL compilation.
    statement = module.insert(model.__table__).on_conflict_do_nothing()
    session.connection().execute(statement, list(rows))


def _ago(session: Session, seconds: float) -> ColumnElement[datetime]:
    """The instant `seconds` before now, by the database's clock where it has one.

    `updated_at` is written by the database (`now()`), so staleness is judged by the
    same clock: workers on hosts with skewed clocks still agree on what is stale.
    (SQLite's `now()` has whole seconds only: there, this process's clock.)
    """
    if session.get_bind().dialect.name == "postgresql":
        return func.now() - timedelta(seconds=seconds)
    return literal(datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=seconds))


def _now(session: Session) -> ColumnElement[datetime]:
    return _ago(session, 0)


# -- runs ----------------------------------------------------------------------------------


def create_run(
    url: str,
    *,
    run_id: str,
    agent: str | None,
    input_label: str,
    options: dict[str, Any],
    config: dict[str, Any],
    parent_run_id: str | None = None,
    deadline_at: float | None = None,
) -> None:
    with session_scope(url) as session:
        session.add(
            RunRow(
                id=run_id,
                # Set here rather than by the database: SQLite's CURRENT_TIMESTAMP has
                # whole seconds, and `latest_run` ("last") must tell apart two runs
                # submitted within one second (their ids then sort at random).
                created_at=datetime.now(UTC),
                status="pending",
                submitted_by=submitted_by(),
                agent=agent,
                input_label=input_label,
                options=options,
                config=config,
                parent_run_id=parent_run_id,
                deadline_at=deadline_at,
            )
        )


@dataclass(frozen=True)
class NewCase:
    seq: int
    case_id: str
    case: dict[str, Any]
    agent: str | None


def add_cases(url: str, run_id: str, cases: Iterable[NewCase]) -> int:
    rows = [
        {
            "run_id": run_id,
            "case_id": c.case_id,
            "seq": c.seq,
            "case": c.case,
            "agent": c.agent,
            "phase": "pending",
            "next_turn": 1,
            "deliveries": 0,
        }
        for c in cases
    ]
    with session_scope(url) as session:
        _insert(session, CaseRow, rows)
    return len(rows)


def start_run(url: str, run_id: str, total: int, started_at: datetime | None = None) -> bool:
    """Mark the run running with its number of cases; whether they have all ended already.

    Conversations may start while their run is still being stored (the fleet starts each
    batch as soon as it is written). Until this is called the run is `pending` and a
    conversation that ends does not finish it (its total is not known yet); if they all
    ended before, the caller must enqueue the aggregation. Against a conversation ending
    at the same moment, the row lock decides: either this sees it ended, or it sees the
    run running and complete.
    """
    with session_scope(url) as session:
        finished = session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(status="running", total_cases=total, started_at=started_at or datetime.now(UTC))
            .returning(RunRow.finished_cases)
        ).scalar_one()
    return bool(finished >= total)


def get_run(url: str, run_id: str) -> RunRow | None:
    with session_scope(url) as session:
        return session.get(RunRow, run_id)


def latest_run(url: str) -> RunRow | None:
    with session_scope(url) as session:
        return session.scalars(
            select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id.desc()).limit(1)
        ).first()


def cancel_run(url: str, run_id: str, reason: str) -> bool:
    with session_scope(url) as session:
        result = session.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.cancelled.is_(False))
            .values(cancelled=True, cancel_reason=reason)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def delete_run(url: str, run_id: str) -> None:
    """Remove a run that never started (its cases failed to store, or its submitter was
    stopped while storing them).

    Its first conversations may be running meanwhile. The cases go first: a step being
    saved holds its case's row, so this waits for it and its rows are then deleted with
    the rest, and a step saved later finds no case to move (a step's rows are written
    only with its case's move). Deleting the turn rows first left those of a step
    committed in between.
    """
    with session_scope(url) as session:
        session.execute(delete(CaseRow).where(CaseRow.run_id == run_id))
        session.execute(delete(TurnRow).where(TurnRow.run_id == run_id))
        session.execute(delete(AssertionResultRow).where(AssertionResultRow.run_id == run_id))
        session.execute(delete(AgentCallRow).where(AgentCallRow.run_id == run_id))
        session.execute(delete(RunRow).where(RunRow.id == run_id))


# -- conversations -------------------------------------------------------------------------


# The turn's hot path (load_case, save_step) runs prebuilt Core statements on a plain
# connection: their compiled forms are cached, and no ORM unit of work is involved.
# Building the same expressions and going through the ORM on every turn cost more CPU
# than everything else a turn does (benchmarks/throughput.py).
_cases: Table = CaseRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]

_LOAD = (
    select(
        # As text: see steps.JsonDocument.
        cast(_cases.c.case, Text).label("case"),
        _cases.c.agent,
        _cases.c.phase,
        _cases.c.next_turn,
        cast(_cases.c.state, Text).label("state"),
        _cases.c.deliveries,
        _runs.c.cancelled,
        _runs.c.cancel_reason,
        _runs.c.deadline_at,
        _runs.c.total_tokens,
        _runs.c.total_cost,
        _runs.c.status.label("run_status"),
        _runs.c.finished_cases,
        _runs.c.total_cases,
    )
    .select_from(_cases.join(_runs, _runs.c.id == _cases.c.run_id))
    .where(_cases.c.run_id == bindparam("b_run"), _cases.c.case_id == bindparam("b_case"))
)
_COUNT_DELIVERY = (
    update(_cases)
    .where(
        _cases.c.run_id == bindparam("b_run"),
        _cases.c.case_id == bindparam("b_case"),
        _cases.c.next_turn == bindparam("b_turn"),
    )
    .values(deliveries=_cases.c.deliveries + 1)
    .returning(_cases.c.deliveries)
)
_RUN_SETTINGS = select(_runs.c.options, _runs.c.config).where(_runs.c.id == bindparam("b_run"))


class _LoadedRow(NamedTuple):
    """A row of _LOAD, its columns in order (tests/test_run_store.py checks them)."""

    case: str
    agent: str | None
    phase: str
    next_turn: int
    state: str | None
    deliveries: int
    cancelled: bool
    cancel_reason: str | None
    deadline_at: float | None
    total_tokens: int
    total_cost: float
    run_status: str
    finished_cases: int
    total_cases: int


# Parameters of the hot path that are JSON: the conversation's documents (json columns,
# models.DocumentType) and the child rows (read by jsonb_to_recordset).
_JSON_PARAMS: dict[str, JsonKind] = {
    "b_state": "json",
    "b_result": "json",
    "b_turn_rows": "jsonb",
    "b_verdict_rows": "jsonb",
    "b_call_rows": "jsonb",
}


def _turn_connection(engine: Engine) -> AbstractContextManager[TurnConnection]:
    return turn_connection(engine, _JSON_PARAMS)


# What a run was created with never changes: read once per process and run.
_settings_cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
_settings_lock = threading.Lock()


def _run_settings(connection: TurnConnection, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with _settings_lock:
        cached = _settings_cache.get(run_id)
    if cached is None:
        found = connection.fetch_one(_RUN_SETTINGS, {"b_run": run_id})
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
    url: str, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
) -> LoadedCase | None:
    """The conversation and what its run says; optionally counting this delivery.

    With `turn`, only a delivery of the turn the conversation is waiting for counts: a
    duplicate or stale message must not use up the next turn's delivery budget.
    """
    with _turn_connection(get_engine(url)) as connection:
        found = connection.fetch_one(_LOAD, {"b_run": run_id, "b_case": case_id})
        if found is None:
            return None
        row = _LoadedRow(*found)
        deliveries = row.deliveries
        current = turn is None or (row.next_turn == turn and row.phase in ("pending", "ready"))
        if count_delivery and current:
            counted = connection.fetch_one(
                _COUNT_DELIVERY,
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
        )


# None must be SQL NULL (a case without a result yet), not the JSON value null.
JSON_OR_NULL = JSON(none_as_null=True)

_STEP_VALUES = {
    "next_turn": bindparam("b_next"),
    "phase": bindparam("b_phase"),
    "state": bindparam("b_state", type_=JSON_OR_NULL),
    "status": bindparam("b_status"),
    "result": bindparam("b_result", type_=JSON_OR_NULL),
    "deliveries": 0,
    "step_token": bindparam("b_token"),
}
_STEP_KEYS = [
    _cases.c.run_id == bindparam("b_run"),
    _cases.c.case_id == bindparam("b_case"),
    _cases.c.next_turn == bindparam("b_turn"),
]
# The guard: the conversation must still be at the turn this step ran (and running, or
# parked for a person when a person's reply is what is being saved).
_SAVE_RUNNING = (
    update(_cases)
    .where(*_STEP_KEYS, or_(_cases.c.phase == "pending", _cases.c.phase == "ready"))
    .values(**_STEP_VALUES)
)
_SAVE_PARKED = (
    update(_cases)
    .where(*_STEP_KEYS, _cases.c.phase == bindparam("b_expected_phase"))
    .values(**_STEP_VALUES)
)
_SPEND = (
    update(_runs)
    .where(_runs.c.id == bindparam("b_run"))
    .values(
        total_tokens=_runs.c.total_tokens + bindparam("b_tokens"),
        total_cost=_runs.c.total_cost + bindparam("b_cost"),
    )
)
_CASE_ENDED = (
    update(_runs)
    .where(_runs.c.id == bindparam("b_run"))
    .values(
        finished_cases=_runs.c.finished_cases + 1,
        total_turns=_runs.c.total_turns + bindparam("b_turns"),
        total_tokens=_runs.c.total_tokens + bindparam("b_tokens"),
        total_cost=_runs.c.total_cost + bindparam("b_cost"),
        passed=_runs.c.passed + bindparam("b_passed"),
        failed=_runs.c.failed + bindparam("b_failed"),
        skipped=_runs.c.skipped + bindparam("b_skipped"),
    )
    .returning(_runs.c.finished_cases, _runs.c.total_cases, _runs.c.status)
)


_CASE_TOKEN = select(_cases.c.step_token).where(
    _cases.c.run_id == bindparam("b_run"), _cases.c.case_id == bindparam("b_case")
)
_RUN_COUNTS = select(_runs.c.finished_cases, _runs.c.total_cases, _runs.c.status).where(
    _runs.c.id == bindparam("b_run")
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
    found = connection.fetch_one(_CASE_TOKEN, {"b_run": step[0], "b_case": step[1]})
    return found is not None and found[0] == known[3]


def _run_complete(connection: TurnConnection, run_id: str) -> bool:
    found = connection.fetch_one(_RUN_COUNTS, {"b_run": run_id})
    if found is None:
        return False
    finished, total, status = found
    return bool(status == "running" and finished >= total)


_INSERTS: dict[tuple[str, type[Base]], Any] = {}


def insert_rows(connection: Any, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    dialect = connection.dialect.name
    statement = _INSERTS.get((dialect, model))
    if statement is None:
        module: Any = postgresql if dialect == "postgresql" else sqlite
        statement = module.insert(model.__table__).on_conflict_do_nothing()
        _INSERTS[(dialect, model)] = statement
    if dialect == "postgresql":
        rows = [storable_row(row) for row in rows]
    connection.execute(statement, list(rows))


def insert_step_rows(connection: Any, rows: StepRows) -> None:
    """A step's (or a batch of steps') turn, assertion and agent-call rows."""
    insert_rows(connection, TurnRow, rows.turns)
    insert_rows(connection, AssertionResultRow, rows.verdicts)
    insert_rows(connection, AgentCallRow, rows.calls)


# Postgres saves a step in one statement: the guarded UPDATE as a CTE, and the turn,
# assertion and call rows (passed as JSON arrays) inserted only if it moved the
# conversation on, with the run's counters when the case ends. One round trip instead
# of seven (BEGIN, UPDATE, three INSERTs, UPDATE, COMMIT): the database work is the
# same, the worker's CPU per turn is not (benchmarks/throughput.py).
# The columns of turn_rows, assertion_rows and call_rows (tests/test_run_store.py).
_ROW_COLUMNS: dict[type[Base], tuple[str, ...]] = {
    TurnRow: (
        "run_id",
        "case_id",
        "turn",
        "input",
        "input_source",
        "output",
        "tool_calls",
        "awaiting_input",
        "status",
        "duration_ms",
        "error",
        "skip_reason",
    ),
    AssertionResultRow: (
        "run_id",
        "case_id",
        "turn",
        "position",
        "type",
        "passed",
        "reason",
        "detail",
    ),
    AgentCallRow: (
        "run_id",
        "case_id",
        "turn",
        "position",
        "role",
        "agent",
        "latency_ms",
        "attempts",
        "status_code",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "error",
    ),
}


def _insert_if_moved(model: type[Base], param: str, moved: Any) -> Any:
    table: Table = model.__table__  # type: ignore[assignment]
    names = _ROW_COLUMNS[model]
    rows = (
        func.jsonb_to_recordset(bindparam(param, type_=JSONB))
        .table_valued(*(column(name, table.c[name].type) for name in names))
        .render_derived(name=f"new_{table.name}", with_types=True)
    )
    chosen = select(*(rows.c[name] for name in names)).where(select(moved.c.case_id).exists())
    insert = postgresql.insert(table).from_select(list(names), chosen).on_conflict_do_nothing()
    return insert.cte(f"insert_{table.name}")


@lru_cache(maxsize=64)
def _pg_step(
    parked: bool, turns: bool, verdicts: bool, calls: bool, ended: bool, spent: bool
) -> Select[Any]:
    moved = (_SAVE_PARKED if parked else _SAVE_RUNNING).returning(_cases.c.case_id).cte("moved")
    if_moved = select(moved.c.case_id).exists()
    ctes = [
        _insert_if_moved(model, param, moved)
        for wanted, model, param in (
            (turns, TurnRow, "b_turn_rows"),
            (verdicts, AssertionResultRow, "b_verdict_rows"),
            (calls, AgentCallRow, "b_call_rows"),
        )
        if wanted
    ]
    if ended:
        counts = _CASE_ENDED.where(if_moved).cte("ended")
        statement = select(
            moved.c.case_id, counts.c.finished_cases, counts.c.total_cases, counts.c.status
        ).select_from(moved.outerjoin(counts, true()))
    else:
        if spent:
            ctes.append(_SPEND.where(if_moved).cte("spent"))
        statement = select(moved.c.case_id)
    return statement.add_cte(*ctes)


@reconnecting
def save_step(
    url: str,
    *,
    run_id: str,
    case_id: str,
    expected_turn: int,
    next_turn: int,
    phase: str,
    state: JsonDocument,
    new_turns: Sequence[TurnResult],
    final_assertions: Sequence[AssertionResult] = (),
    result: CaseResult | None = None,
    expected_phase: str | None = None,
    spend: tuple[int, float] | None = None,
) -> Saved:
    """Record one step of a conversation, exactly once (see the module docstring).

    Retried by `reconnecting` when the connection drops. If it dropped after the write
    landed, the retry finds the guard moved on by its own write (the step's token) and
    reports the step saved, so that the caller still enqueues the next turn; any other
    write it finds there (a duplicate's) is not saved.

    `spend` (tokens, cost) is added to the run's totals with the step: runs with a
    budget account per turn, so the next turn anywhere in the fleet sees it. Without,
    tokens are added once per case when it ends (one write to the run row per case).
    """
    step = (run_id, case_id, expected_turn)
    known = getattr(_written, "step", None)
    if not retrying() or known is None or known[:3] != step:
        # A first attempt: nothing of this call was written yet.
        _written.step = known = (*step, secrets.token_hex(16))
    engine = get_engine(url)
    postgres = engine.dialect.name == "postgresql"
    params: dict[str, Any] = {
        "b_run": run_id,
        "b_case": case_id,
        "b_turn": expected_turn,
        "b_next": next_turn,
        "b_phase": phase,
        # Postgres takes JSON text as it is (the hot path sends it as jsonb); elsewhere
        # the JSON column type writes the objects itself.
        "b_state": _json_text(state) if postgres else as_object(state),
        "b_status": result.status if result else None,
        "b_token": known[3],
    }
    if result is None:
        params["b_result"] = None
    elif postgres:
        params["b_result"] = JsonText(result.model_dump_json())
    else:
        params["b_result"] = result.model_dump(mode="json")
    if expected_phase is not None:
        params["b_expected_phase"] = expected_phase
    rows = step_rows(run_id, case_id, new_turns, final_assertions)
    tokens, cost = step_spend(spend, result)
    if result is not None:
        params.update(
            b_turns=result.total_turns,
            b_passed=int(result.status == "passed"),
            b_failed=int(result.status == "failed"),
            b_skipped=int(result.status == "skipped"),
        )
    params.update(b_tokens=tokens, b_cost=cost)

    if postgres:
        statement = _pg_step(
            expected_phase is not None,
            bool(rows.turns),
            bool(rows.verdicts),
            bool(rows.calls),
            result is not None,
            bool(tokens or cost),
        )
        params.update(b_turn_rows=rows.turns, b_verdict_rows=rows.verdicts, b_call_rows=rows.calls)
        with _turn_connection(engine) as connection:
            row = connection.fetch_one(statement, params)
            if row is None:
                return _not_moved(connection, step, result)
        if result is None:
            return Saved(True)
        _, finished, total, status = row
        return Saved(True, run_finished=status == "running" and finished >= total)

    with engine.begin() as connection:
        guard = _SAVE_RUNNING if expected_phase is None else _SAVE_PARKED
        if not connection.execute(guard, params).rowcount:
            return _not_moved(SqlAlchemyTurnConnection(connection), step, result)
        insert_step_rows(connection, rows)
        if result is None:
            if tokens or cost:
                connection.execute(_SPEND, params)
            return Saved(True)
        finished, total, status = connection.execute(_CASE_ENDED, params).one()
        return Saved(True, run_finished=status == "running" and finished >= total)


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
        return Saved(True, run_finished=finished)
    return Saved(False)


# -- aggregation and reading results ------------------------------------------------------------


def claim_aggregation(url: str, run_id: str, lease_seconds: float | None = None) -> bool:
    """True for exactly one caller once every conversation of the run has finished.

    The claim is a lease: `finished_at` records when it was taken, and a run left in
    `aggregating` for longer than `lease_seconds` (default: the stall threshold) can be
    claimed again, so an aggregator that died mid-way does not leave the run unfinished
    forever. (A redelivered aggregation task cannot do it: the claim is already taken.)
    """
    lease = get_settings().stall_seconds if lease_seconds is None else lease_seconds
    with session_scope(url) as session:
        result = session.execute(
            update(RunRow)
            .where(
                RunRow.id == run_id,
                RunRow.finished_cases >= RunRow.total_cases,
                or_(
                    RunRow.status == "running",
                    and_(
                        RunRow.status == "aggregating",
                        RunRow.finished_at.is_not(None),
                        RunRow.finished_at < _ago(session, lease),
                    ),
                ),
            )
            .values(status="aggregating", finished_at=_now(session))
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def complete_run(url: str, run_id: str, reports: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Store the run's reports (format -> its pieces, as rendered) and mark it done.

    On Postgres the reports are streamed to the server as they are rendered (see
    reports.py) and nothing is returned; elsewhere they are joined to be stored and
    returned (format -> text), so that a caller printing one need not render it again.
    """
    joined: dict[str, str] = {}
    with session_scope(url) as session:
        if session.get_bind().dialect.name == "postgresql":
            copy_reports(session, run_id, reports)
        else:
            joined = {fmt: "".join(pieces) for fmt, pieces in reports.items()}
            _insert(
                session,
                RunReportRow,
                [
                    {"run_id": run_id, "format": fmt, "content": body}
                    for fmt, body in joined.items()
                ],
            )
        session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(status="done", finished_at=datetime.now(UTC))
        )
    return joined


def get_report(url: str, run_id: str, fmt: str) -> str | None:
    with session_scope(url) as session:
        row = session.get(RunReportRow, (run_id, fmt))
        return row.content if row else None


def iter_results(url: str, run_id: str, batch: int = 500) -> Iterator[CaseResult]:
    """The run's case records in submission order, read in batches."""
    for text in iter_result_texts(url, run_id, batch):
        # Parsed and checked in one pass by pydantic-core: the driver's json.loads and
        # then validating the Python objects took twice as long.
        yield CaseResult.model_validate_json(text)


def iter_result_texts(url: str, run_id: str, batch: int = 500) -> Iterator[str]:
    """The run's case records in submission order, as JSON text, read in batches."""
    last = -1
    while True:
        with session_scope(url) as session:
            rows = session.execute(
                select(CaseRow.seq, cast(CaseRow.result, Text))
                .where(CaseRow.run_id == run_id, CaseRow.seq > last, CaseRow.result.is_not(None))
                .order_by(CaseRow.seq)
                .limit(batch)
            ).all()
        if not rows:
            return
        for seq, result in rows:
            last = seq
            yield result


def iter_case_ids(
    url: str, run_id: str, phase: str, batch: int = 1000
) -> Iterator[tuple[str, int]]:
    """(case_id, next_turn) of the run's conversations in a phase, in submission order."""
    last = -1
    while True:
        with session_scope(url) as session:
            rows = session.execute(
                select(CaseRow.seq, CaseRow.case_id, CaseRow.next_turn)
                .where(CaseRow.run_id == run_id, CaseRow.phase == phase, CaseRow.seq > last)
                .order_by(CaseRow.seq)
                .limit(batch)
            ).all()
        if not rows:
            return
        for seq, case_id, next_turn in rows:
            last = seq
            yield case_id, next_turn


def count_turn_rows(url: str, run_id: str) -> list[tuple[str, int, int]]:
    """(case_id, turn, rows) for every recorded turn: what fault tests check for doubles."""
    with session_scope(url) as session:
        rows = session.execute(
            select(TurnRow.case_id, TurnRow.turn, func.count())
            .where(TurnRow.run_id == run_id)
            .group_by(TurnRow.case_id, TurnRow.turn)
        ).all()
        return [(c, t, n) for c, t, n in rows]


def count_played_turns(url: str, run_id: str) -> int:
    """Turns played and recorded so far, in finished conversations or not (the run's
    `total_turns` counts those of finished conversations only)."""
    with session_scope(url) as session:
        found = session.execute(
            select(func.count())
            .select_from(TurnRow)
            .where(TurnRow.run_id == run_id, TurnRow.input.is_not(None))
        ).scalar_one()
        return int(found)


# -- recovering from lost messages --------------------------------------------------------------


def _stalled_runs(session: Session, stall_seconds: float, run_id: str | None) -> Any:
    """Running runs none of whose conversations moved (turn started or saved) lately."""
    query = (
        select(CaseRow.run_id)
        .join(RunRow, RunRow.id == CaseRow.run_id)
        .where(RunRow.status == "running")
        .group_by(CaseRow.run_id)
        .having(func.max(CaseRow.updated_at) < _ago(session, stall_seconds))
    )
    if run_id is not None:
        query = query.where(CaseRow.run_id == run_id)
    return query


def _nothing_moved_since(cutoff: Any) -> ColumnElement[bool]:
    """For a query on runs: none of the run's conversations was stored or moved since
    `cutoff` (or it has none)."""
    moved = (
        select(func.max(CaseRow.updated_at)).where(CaseRow.run_id == RunRow.id).scalar_subquery()
    )
    return or_(moved.is_(None), moved < cutoff)


ABANDONED_REASON = (
    "its submitter stopped while storing the run, after {stored} case(s); "
    "the rest of the input was never stored"
)


@dataclass(frozen=True)
class ClosedRun:
    run_id: str
    stored: int


def close_abandoned_runs(
    url: str, stall_seconds: float, run_id: str | None = None
) -> list[ClosedRun]:
    """Runs left `pending` by a submitter that died while storing them, closed.

    A run stays `pending` until its submitter has stored every case (`start_run`); one
    killed outright in between (SIGKILL, the out-of-memory killer; SIGTERM and Ctrl-C
    remove the run) leaves it so for ever, with part of its cases, some of them already
    started. Such a run, created more than `stall_seconds` ago and with nothing stored
    or moved since, is started with the cases it has and cancelled with the reason: its
    conversations that have not ended end as skipped (the sweeper's next pass enqueues
    them), and the run is aggregated as any other. The guard on `pending` makes exactly
    one sweeper close it.
    """
    with session_scope(url) as session:
        cutoff = _ago(session, stall_seconds)
        query = select(RunRow.id).where(
            RunRow.status == "pending",
            RunRow.created_at < cutoff,
            _nothing_moved_since(cutoff),
        )
        if run_id is not None:
            query = query.where(RunRow.id == run_id)
        abandoned = list(session.scalars(query))
    closed: list[ClosedRun] = []
    for candidate in abandoned:
        with session_scope(url) as session:
            stored = session.scalar(
                select(func.count()).select_from(CaseRow).where(CaseRow.run_id == candidate)
            )
            count = int(stored or 0)
            moved_now = session.execute(
                update(RunRow)
                .where(RunRow.id == candidate, RunRow.status == "pending")
                .values(
                    status="running",
                    total_cases=count,
                    started_at=func.coalesce(RunRow.started_at, RunRow.created_at),
                    cancelled=True,
                    cancel_reason=ABANDONED_REASON.format(stored=count),
                )
            )
            if moved_now.rowcount:  # type: ignore[attr-defined]
                closed.append(ClosedRun(candidate, count))
    return closed


def claim_stalled(
    url: str, stall_seconds: float, run_id: str | None = None, limit: int = 1000
) -> list[tuple[str, str, int]]:
    """(run, case, next_turn) of conversations whose message was presumably lost; claimed.

    A run is stalled when none of its conversations has moved (no turn started, none
    saved) for `stall_seconds` while some are still pending or ready: their messages are
    gone (a broker restart without persistence, a publish that failed for good).
    Judging the run rather than each conversation keeps a long but moving queue from
    being mistaken for a loss and flooded with copies. Each returned conversation has
    been claimed by touching its `updated_at` with a guarded UPDATE, so among several
    sweepers exactly one re-enqueues it, and nobody again for another `stall_seconds`.
    """
    with session_scope(url) as session:
        stalled = _stalled_runs(session, stall_seconds, run_id).subquery()
        candidates = session.execute(
            select(CaseRow.run_id, CaseRow.case_id, CaseRow.next_turn)
            .join(stalled, stalled.c.run_id == CaseRow.run_id)
            .where(CaseRow.phase.in_(("pending", "ready")))
            .order_by(CaseRow.run_id, CaseRow.seq)
            .limit(limit)
        ).all()
    claimed: list[tuple[str, str, int]] = []
    for run, case_id, next_turn in candidates:
        with session_scope(url) as session:
            touched = session.execute(
                update(CaseRow)
                .where(
                    CaseRow.run_id == run,
                    CaseRow.case_id == case_id,
                    CaseRow.next_turn == next_turn,
                    CaseRow.phase.in_(("pending", "ready")),
                    CaseRow.updated_at < _ago(session, stall_seconds),
                )
                .values(updated_at=func.now())
            )
            if touched.rowcount:  # type: ignore[attr-defined]
                claimed.append((run, case_id, next_turn))
    return claimed


def unaggregated_runs(url: str, stall_seconds: float, run_id: str | None = None) -> list[str]:
    """Runs whose conversations all ended but whose aggregation never happened.

    Either still `running` with every conversation finished and nothing moved for
    `stall_seconds` (the aggregation message was lost), or `aggregating` for longer than
    that (the aggregator died). `claim_aggregation` decides who does it, once.
    """
    with session_scope(url) as session:
        cutoff = _ago(session, stall_seconds)
        query = select(RunRow.id).where(
            RunRow.finished_cases >= RunRow.total_cases,
            or_(
                and_(RunRow.status == "running", _nothing_moved_since(cutoff)),
                and_(RunRow.status == "aggregating", RunRow.finished_at < cutoff),
            ),
        )
        if run_id is not None:
            query = query.where(RunRow.id == run_id)
        return list(session.scalars(query))


def store_report(url: str, run_id: str, fmt: str, content: str) -> None:
    """Keep one more report with the run (e.g. a reporter agent's), replacing an older one."""
    with session_scope(url) as session:
        session.execute(
            delete(RunReportRow).where(RunReportRow.run_id == run_id, RunReportRow.format == fmt)
        )
        session.add(RunReportRow(run_id=run_id, format=fmt, content=content))


@reconnecting
def pending_case_ids(url: str, run_id: str, first: int, last: int) -> list[str]:
    """Ids of the run's conversations numbered first..last that have not started."""
    with session_scope(url) as session:
        return list(
            session.scalars(
                select(CaseRow.case_id)
                .where(
                    CaseRow.run_id == run_id,
                    CaseRow.seq >= first,
                    CaseRow.seq <= last,
                    CaseRow.phase == "pending",
                )
                .order_by(CaseRow.seq)
            )
        )
