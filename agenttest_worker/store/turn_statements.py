"""The statements of a turn's hot path (turns.py runs them), built once at import.

The turn's hot path (load_case, save_step) runs prebuilt Core statements on a plain
connection: their compiled forms are cached, and no ORM unit of work is involved.
Building the same expressions and going through the ORM on every turn cost more CPU
than everything else a turn does (benchmarks/throughput.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    String,
    Table,
    Text,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import Select

from agenttest_worker.store._sql import CASES, JSON_OR_NULL, RUNS
from agenttest_worker.store.hot_path import JsonKind
from agenttest_worker.store.models import (
    AgentCallRow,
    AssertionResultRow,
    Base,
    TurnRecordRow,
    TurnRow,
)
from agenttest_worker.store.steps import StepRows
from agenttest_worker.store.storable import storable_row

# -- loading a conversation ------------------------------------------------------------------

TURN_RECORDS: Table = TurnRecordRow.__table__  # type: ignore[assignment]
_OF_CASE = (
    TURN_RECORDS.c.run_id == bindparam("b_run"),
    TURN_RECORDS.c.case_id == bindparam("b_case"),
)
# The row still holds the step whose state this process kept (kept_states.py): neither
# the state nor the turn records are read (nor, Postgres being lazy in CASE, detoasted).
_KEPT = CASES.c.step_token == bindparam("b_known", type_=String)
# The conversation's turn records as the inside of a JSON array (`a,b,c`), in order, or
# NULL when it has none; one statement with the state, so that both are of one moment.
# (Postgres's form is built in load_statement: see there.)
# The messages stored with them likewise (NULL when none are; both aggregates skip NULLs).
_ORDERED = (
    select(TURN_RECORDS.c.record, TURN_RECORDS.c.messages)
    .where(*_OF_CASE)
    .order_by(TURN_RECORDS.c.position)
)


def _concatenated(name: str) -> ColumnElement[str]:
    ordered = _ORDERED.subquery()
    return select(func.group_concat(ordered.c[name], ",")).scalar_subquery()


def _load(records: ColumnElement[str], messages: ColumnElement[str]) -> Select[Any]:
    return (
        select(
            # As text: see steps.JsonDocument.
            cast(CASES.c.case, Text).label("case"),
            CASES.c.agent,
            CASES.c.phase,
            CASES.c.next_turn,
            case((_KEPT, null()), else_=cast(CASES.c.state, Text)).label("state"),
            CASES.c.deliveries,
            RUNS.c.cancelled,
            RUNS.c.cancel_reason,
            RUNS.c.deadline_at,
            RUNS.c.total_tokens,
            RUNS.c.total_cost,
            RUNS.c.status.label("run_status"),
            RUNS.c.finished_cases,
            RUNS.c.total_cases,
            CASES.c.step_token,
            case((_KEPT, null()), else_=records).label("records"),
            case((_KEPT, null()), else_=messages).label("messages"),
        )
        .select_from(CASES.join(RUNS, RUNS.c.id == CASES.c.run_id))
        .where(CASES.c.run_id == bindparam("b_run"), CASES.c.case_id == bindparam("b_case"))
    )


# SQLite keeps the order of the rows it is given; Postgres orders the aggregate itself.
LOAD_OTHER = _load(_concatenated("record"), _concatenated("messages"))


@lru_cache(maxsize=4)
def load_statement(dialect: str) -> Select[Any]:
    """The conversation's read (LoadedRow's columns) in `dialect`.

    Postgres's is built on first use: its aggregate needs SQLAlchemy's Postgres dialect,
    whose import (~0.15 s of CPU) an embedded run on SQLite never pays.
    """
    if dialect != "postgresql":
        return LOAD_OTHER
    from sqlalchemy.dialects.postgresql import aggregate_order_by  # see the docstring

    ordered: Any = aggregate_order_by(literal_column("','"), TURN_RECORDS.c.position)
    records = select(func.string_agg(TURN_RECORDS.c.record, ordered)).where(*_OF_CASE)
    messages = select(func.string_agg(TURN_RECORDS.c.messages, ordered)).where(*_OF_CASE)
    return _load(records.scalar_subquery(), messages.scalar_subquery())


COUNT_DELIVERY = (
    update(CASES)
    .where(
        CASES.c.run_id == bindparam("b_run"),
        CASES.c.case_id == bindparam("b_case"),
        CASES.c.next_turn == bindparam("b_turn"),
    )
    .values(deliveries=CASES.c.deliveries + 1)
    .returning(CASES.c.deliveries)
)
RUN_SETTINGS = select(RUNS.c.options, RUNS.c.config).where(RUNS.c.id == bindparam("b_run"))


class LoadedRow(NamedTuple):
    """A row of LOAD, its columns in order (tests/test_run_store.py checks them)."""

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
    step_token: str | None
    records: str | None
    messages: str | None


# Parameters of the hot path that are JSON: the conversation's documents (json columns,
# models.DocumentType) and the child rows (read by jsonb_to_recordset).
JSON_PARAMS: dict[str, JsonKind] = {
    "b_state": "json",
    "b_result": "json",
    "b_turn_rows": "jsonb",
    "b_verdict_rows": "jsonb",
    "b_call_rows": "jsonb",
    "b_record_rows": "jsonb",
}

# -- saving a step -------------------------------------------------------------------------

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
    CASES.c.run_id == bindparam("b_run"),
    CASES.c.case_id == bindparam("b_case"),
    CASES.c.next_turn == bindparam("b_turn"),
]


def _phase_is(phase: Any) -> ColumnElement[bool]:
    """The conversation's phase is `phase`, in a form no index can serve.

    Written plainly (`phase = 'ready'`), Postgres could find the row through the
    (run_id, phase) index instead of the primary key: by statistics of earlier runs,
    whose conversations had mostly ended, or by none (new_run.statistics_behind), both
    look like one row. That index holds every conversation of the run in that phase,
    thousands when thousands are in flight, and the save then read them all: ~20 ms of
    the database's CPU per save at 10,000 in flight (benchmarks/RESULTS.md). Found by
    its primary key, the row is one index probe away; its phase is checked on it."""
    found: ColumnElement[bool] = func.coalesce(CASES.c.phase, "") == phase
    return found


# The guard: the conversation must still be at the turn this step ran (and running, or
# parked for a person when a person's reply is what is being saved).
SAVE_RUNNING = (
    update(CASES)
    .where(*_STEP_KEYS, or_(_phase_is("pending"), _phase_is("ready")))
    .values(**_STEP_VALUES)
)
SAVE_PARKED = (
    update(CASES)
    .where(*_STEP_KEYS, _phase_is(bindparam("b_expected_phase")))
    .values(**_STEP_VALUES)
)


def save_guard(parked: bool) -> Any:
    """The guarded UPDATE that moves a conversation on (see above)."""
    return SAVE_PARKED if parked else SAVE_RUNNING


SPEND = (
    update(RUNS)
    .where(RUNS.c.id == bindparam("b_run"))
    .values(
        total_tokens=RUNS.c.total_tokens + bindparam("b_tokens"),
        total_cost=RUNS.c.total_cost + bindparam("b_cost"),
    )
)


def _least(a: ColumnElement[int], b: ColumnElement[int]) -> ColumnElement[int]:
    return case((a < b, a), else_=b)  # (SQLite has no LEAST)


def started_after_claim(
    finished: ColumnElement[int], stopping: ColumnElement[bool]
) -> ColumnElement[int]:
    """`started_cases` once the run's free slots are claimed (--parallel on a fleet).

    Conversations start in `seq` order, at most `parallel` of them unfinished at once;
    `finished` is the run's finished count as it will be. A run being stopped (cancelled,
    or `stopping`: --fail-fast as its first case fails) claims all the rest at once: they
    end skipped without calling any agent. A run without a cap, or not running yet, claims
    nothing (its conversations were all started as they were stored).
    """
    fill = _least(RUNS.c.total_cases, finished + RUNS.c.parallel)
    return case(
        (or_(RUNS.c.parallel.is_(None), RUNS.c.status != "running"), RUNS.c.started_cases),
        (or_(RUNS.c.cancelled, stopping), RUNS.c.total_cases),
        (RUNS.c.started_cases < fill, fill),
        else_=RUNS.c.started_cases,
    )


# --fail-fast: the reason the run stops, set by the step that ends its first failed case
# (NULL otherwise), so that this same statement starts nothing new.
_STOP = cast(bindparam("b_stop", type_=Text), Text)
CASE_ENDED = (
    update(RUNS)
    .where(RUNS.c.id == bindparam("b_run"))
    .values(
        finished_cases=RUNS.c.finished_cases + 1,
        total_turns=RUNS.c.total_turns + bindparam("b_turns"),
        total_tokens=RUNS.c.total_tokens + bindparam("b_tokens"),
        total_cost=RUNS.c.total_cost + bindparam("b_cost"),
        passed=RUNS.c.passed + bindparam("b_passed"),
        failed=RUNS.c.failed + bindparam("b_failed"),
        skipped=RUNS.c.skipped + bindparam("b_skipped"),
        cancelled=or_(RUNS.c.cancelled, _STOP.is_not(None)),
        cancel_reason=case((RUNS.c.cancelled, RUNS.c.cancel_reason), else_=_STOP),
        # The conversation that ends starts the next ones in the same statement: none is
        # started twice, none lost (the range is claimed_from..started_cases).
        started_cases=started_after_claim(RUNS.c.finished_cases + 1, _STOP.is_not(None)),
        claimed_from=RUNS.c.started_cases,
    )
    .returning(
        RUNS.c.finished_cases,
        RUNS.c.total_cases,
        RUNS.c.status,
        RUNS.c.claimed_from,
        RUNS.c.started_cases,
    )
)


CASE_TOKEN = select(CASES.c.step_token).where(
    CASES.c.run_id == bindparam("b_run"), CASES.c.case_id == bindparam("b_case")
)
# A case that ends stores its whole state: its turn records are no longer needed.
FORGET_RECORDS = delete(TURN_RECORDS).where(*_OF_CASE)

RUN_COUNTS = select(RUNS.c.finished_cases, RUNS.c.total_cases, RUNS.c.status).where(
    RUNS.c.id == bindparam("b_run")
)


_INSERTS: dict[tuple[str, type[Base]], Any] = {}


def insert_rows(connection: Any, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    dialect = connection.dialect.name
    statement = _INSERTS.get((dialect, model))
    if statement is None:
        module: Any = _postgresql() if dialect == "postgresql" else sqlite
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
    insert_rows(connection, TurnRecordRow, rows.records)


# -- saving a step on Postgres, in one statement --------------------------------------------

# Postgres saves a step in one statement: the guarded UPDATE as a CTE, and the turn,
# assertion and call rows (passed as JSON arrays) inserted only if it moved the
# conversation on, with the run's counters when the case ends. One round trip instead
# of seven (BEGIN, UPDATE, three INSERTs, UPDATE, COMMIT): the database work is the
# same, the worker's CPU per turn is not (benchmarks/throughput.py).
# The columns of turn_rows, assertion_rows and call_rows (tests/test_run_store.py).
ROW_COLUMNS: dict[type[Base], tuple[str, ...]] = {
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
    TurnRecordRow: ("run_id", "case_id", "position", "record", "messages"),
}


def _postgresql() -> Any:
    """SQLAlchemy's Postgres dialect, imported only where a statement for Postgres is
    built: an embedded run on SQLite does not import it (see load_statement)."""
    from sqlalchemy.dialects import postgresql

    return postgresql


def _insert_if_moved(model: type[Base], param: str, moved: Any) -> Any:
    postgresql = _postgresql()
    table: Table = model.__table__  # type: ignore[assignment]
    names = ROW_COLUMNS[model]
    rows = (
        func.jsonb_to_recordset(bindparam(param, type_=postgresql.JSONB))
        .table_valued(*(column(name, table.c[name].type) for name in names))
        .render_derived(name=f"new_{table.name}", with_types=True)
    )
    chosen = select(*(rows.c[name] for name in names)).where(select(moved.c.case_id).exists())
    insert = postgresql.insert(table).from_select(list(names), chosen).on_conflict_do_nothing()
    return insert.cte(f"insert_{table.name}")


@lru_cache(maxsize=128)
def pg_step(
    parked: bool,
    turns: bool,
    verdicts: bool,
    calls: bool,
    ended: bool,
    spent: bool,
    records: bool = False,
) -> Select[Any]:
    """The one statement saving a step on Postgres, with the parts this step needs."""
    moved = save_guard(parked).returning(CASES.c.case_id).cte("moved")
    if_moved = select(moved.c.case_id).exists()
    ctes = [
        _insert_if_moved(model, param, moved)
        for wanted, model, param in (
            (turns, TurnRow, "b_turn_rows"),
            (verdicts, AssertionResultRow, "b_verdict_rows"),
            (calls, AgentCallRow, "b_call_rows"),
            (records, TurnRecordRow, "b_record_rows"),
        )
        if wanted
    ]
    if ended:
        forgotten = FORGET_RECORDS.where(if_moved).returning(TURN_RECORDS.c.position)
        ctes.append(forgotten.cte("forgotten"))
        counts = CASE_ENDED.where(if_moved).cte("ended")
        statement = select(
            moved.c.case_id,
            counts.c.finished_cases,
            counts.c.total_cases,
            counts.c.status,
            counts.c.claimed_from,
            counts.c.started_cases,
        ).select_from(moved.outerjoin(counts, true()))
    else:
        if spent:
            ctes.append(SPEND.where(if_moved).cte("spent"))
        statement = select(moved.c.case_id)
    return statement.add_cte(*ctes)
