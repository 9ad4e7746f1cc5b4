"""The statements of a turn's step, as SQL text (turns.py runs them).

Every turn loads its conversation and saves one step of it, with the step's turn,
assertion, agent-call and turn-record rows. The statements are written here once, with
`:name` placeholders: SQLAlchemy's `text()` runs them as they are on SQLite (and for
the few steps that take a transaction on Postgres), and psycopg runs them on Postgres
with its own `%(name)s` placeholders (`for_psycopg`). Where the two databases differ
(the load's ordered aggregate; Postgres saving a step in one statement), each has its
own text.
"""

from __future__ import annotations

import re
from functools import cache
from typing import NamedTuple

# -- loading a conversation ------------------------------------------------------------------

# The row still holds the step whose state this process kept (kept_states.py): neither the
# state nor the turn records are read (nor, Postgres being lazy in CASE, detoasted).
_KEPT = "cases.step_token = :b_known"
# The conversation's turn records as the inside of a JSON array (`a,b,c`), in order, or
# NULL when it has none, in one statement with the state, so that both are of one
# moment; the messages stored with them likewise (both aggregates skip NULLs). SQLite
# keeps the order of the rows it is given; Postgres orders the aggregate itself.
_OF_CASE = "turn_records.run_id = :b_run AND turn_records.case_id = :b_case"
_SQLITE_ORDERED = (
    "SELECT group_concat({column}, ',') FROM (SELECT turn_records.{column} FROM turn_records"
    f" WHERE {_OF_CASE} ORDER BY turn_records.position)"
)
_POSTGRES_ORDERED = (
    "SELECT string_agg(turn_records.{column}, ',' ORDER BY turn_records.position)"
    f" FROM turn_records WHERE {_OF_CASE}"
)
# The case and the state as text: see steps.JsonDocument.
_LOAD = f"""SELECT CAST(cases."case" AS TEXT) AS "case", cases.agent, cases.phase,
  cases.next_turn, CASE WHEN {_KEPT} THEN NULL ELSE CAST(cases.state AS TEXT) END AS state,
  cases.deliveries, runs.cancelled, runs.cancel_reason, runs.deadline_at, runs.total_tokens,
  runs.total_cost, runs.status AS run_status, runs.finished_cases, runs.total_cases,
  cases.step_token, CASE WHEN {_KEPT} THEN NULL ELSE ({{records}}) END AS records,
  CASE WHEN {_KEPT} THEN NULL ELSE ({{messages}}) END AS messages
FROM cases JOIN runs ON runs.id = cases.run_id
WHERE cases.run_id = :b_run AND cases.case_id = :b_case"""


def load(dialect: str) -> str:
    """The conversation's read (LoadedRow's columns) in `dialect`."""
    ordered = _POSTGRES_ORDERED if dialect == "postgresql" else _SQLITE_ORDERED
    return _LOAD.format(
        records=ordered.format(column="record"), messages=ordered.format(column="messages")
    )


class LoadedRow(NamedTuple):
    """A row of `load`, its columns in order (tests/test_run_store.py checks them)."""

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


# (updated_at is what the sweeper reads a conversation's staleness by.)
COUNT_DELIVERY = """UPDATE cases SET deliveries = deliveries + 1, updated_at = CURRENT_TIMESTAMP
WHERE run_id = :b_run AND case_id = :b_case AND next_turn = :b_turn
RETURNING deliveries"""
# As text: SQLite hands JSON back as its text, psycopg a jsonb value as objects.
RUN_SETTINGS = "SELECT CAST(options AS TEXT), CAST(config AS TEXT) FROM runs WHERE id = :b_run"

# -- saving a step ---------------------------------------------------------------------------

# The guard: the conversation must still be at the turn this step ran, and in one of
# two phases: pending or ready (running), or twice the phase it is parked in when a
# person's reply is what is being saved (turns.save_step gives them).
#
# The phase is checked as `coalesce(phase, '')`, a form no index can serve. Written
# plainly (`phase = 'ready'`), Postgres could find the row through the (run_id, phase)
# index instead of the primary key: by statistics of earlier runs, whose conversations
# had mostly ended, or by none (new_run.statistics_behind), both look like one row. That
# index holds every conversation of the run in that phase, thousands when thousands are
# in flight, and the save then read them all (benchmarks/RESULTS.md). Found by its primary key, the
# row is one index probe away; its phase is checked on it (tests/test_step_save_plan.py).
SAVE_GUARDED = """UPDATE cases SET next_turn = :b_next, phase = :b_phase, state = :b_state,
  status = :b_status, result = :b_result, deliveries = 0, step_token = :b_token,
  updated_at = CURRENT_TIMESTAMP
WHERE run_id = :b_run AND case_id = :b_case AND next_turn = :b_turn
  AND coalesce(phase, '') IN (:b_from, :b_or_from)"""

SPEND = """UPDATE runs SET total_tokens = total_tokens + :b_tokens,
  total_cost = total_cost + :b_cost
WHERE id = :b_run"""


def _started_after_claim(finished: str, stopping: str) -> str:
    """`started_cases` once the run's free slots are claimed (--parallel on a fleet).

    Conversations start in `seq` order, at most `parallel` of them unfinished at once;
    `finished` is the run's finished count as it will be. A run being stopped (cancelled,
    or `stopping`: --fail-fast as its first case fails) claims all the rest at once: they
    end skipped without calling any agent. A run without a cap, or not running yet, claims
    nothing (its conversations were all started as they were stored).
    """
    fill = (
        f"CASE WHEN total_cases < {finished} + parallel THEN total_cases"
        f" ELSE {finished} + parallel END"
    )
    return (
        "CASE WHEN parallel IS NULL OR status <> 'running' THEN started_cases"
        f" WHEN cancelled OR {stopping} THEN total_cases"
        f" WHEN started_cases < {fill} THEN {fill}"
        " ELSE started_cases END"
    )


# --fail-fast: the reason the run stops, set by the step that ends its first failed case
# (NULL otherwise), so that this same statement starts nothing new. The conversation that
# ends starts the next ones in the same statement: none is started twice, none lost (the
# range is claimed_from..started_cases). In SET, every column named is its value before.
_STOP = "CAST(:b_stop AS TEXT)"
# `:b_chained` is 1 when the step added the next repetition of its case (--repeat auto),
# which takes its place in the count (store/repetition_chain.py), else 0.
_ENDS = "finished_cases + 1 - CAST(:b_chained AS INTEGER)"
_CASE_ENDED = f"""UPDATE runs SET finished_cases = {_ENDS},
  total_turns = total_turns + :b_turns, total_tokens = total_tokens + :b_tokens,
  total_cost = total_cost + :b_cost, passed = passed + :b_passed,
  failed = failed + :b_failed, skipped = skipped + :b_skipped,
  cancelled = (cancelled OR {_STOP} IS NOT NULL),
  cancel_reason = CASE WHEN cancelled THEN cancel_reason ELSE {_STOP} END,
  started_cases = {_started_after_claim(_ENDS, f"{_STOP} IS NOT NULL")},
  claimed_from = started_cases
WHERE id = :b_run"""
_ENDED_COUNTS = "finished_cases, total_cases, status, claimed_from, started_cases"
CASE_ENDED = f"{_CASE_ENDED}\nRETURNING {_ENDED_COUNTS}"

# The claim of a run whose conversations are not ending (runs.claim_starts).
CLAIM_STARTS = f"""UPDATE runs SET
  started_cases = {_started_after_claim("finished_cases", "false")},
  claimed_from = started_cases
WHERE id = :b_run
RETURNING claimed_from, started_cases"""

# --repeat auto (store/repetition_chain.py): the run row locked before the case's
# repetitions are read (Postgres; SQLite's writer holds the database already), those
# repetitions, and the next one added as a copy of one of them (`:b_record` its case).
RUN_STOPPING = "SELECT cancelled FROM runs WHERE id = :b_run"
LOCK_RUN = f"{RUN_STOPPING} FOR UPDATE"
REPETITIONS = """SELECT case_id, CASE WHEN phase = 'done' THEN status END FROM cases
WHERE run_id = :b_run AND test_id = :b_test"""
CASE_TEXT = 'SELECT CAST("case" AS TEXT) FROM cases WHERE run_id = :b_run AND case_id = :b_case'


def add_repetition(dialect: str) -> str:
    """The INSERT of the next repetition in `dialect` (the case is `json` on Postgres)."""
    record = "CAST(:b_record AS json)" if dialect == "postgresql" else ":b_record"
    return f"""INSERT INTO cases (run_id, case_id, test_id, seq, "case", agent, phase,
  next_turn, deliveries, reserved_tokens, reserved_cost, definition_hash, assertion_hashes)
SELECT run_id, :b_key, test_id, seq, {record}, agent, 'pending', 1, 0, 0, 0,
  definition_hash, assertion_hashes
FROM cases WHERE run_id = :b_run AND case_id = :b_case
ON CONFLICT DO NOTHING"""


CASE_TOKEN = "SELECT step_token FROM cases WHERE run_id = :b_run AND case_id = :b_case"
# A case that ends stores its whole state: its turn records are no longer needed.
FORGET_RECORDS = "DELETE FROM turn_records WHERE run_id = :b_run AND case_id = :b_case"
RUN_COUNTS = "SELECT finished_cases, total_cases, status FROM runs WHERE id = :b_run"

# The rows a step adds, by table: each column as steps.py's row builders fill it, with
# its type as Postgres reads it from a JSON array (tests/test_run_store.py checks them).
ROW_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "turns": (
        ("run_id", "text"),
        ("case_id", "text"),
        ("turn", "integer"),
        ("input", "text"),
        ("input_source", "text"),
        ("output", "text"),
        ("tool_calls", "jsonb"),
        ("awaiting_input", "boolean"),
        ("status", "text"),
        ("duration_ms", "integer"),
        ("error", "text"),
        ("skip_reason", "text"),
    ),
    "assertion_results": (
        ("run_id", "text"),
        ("case_id", "text"),
        ("turn", "integer"),
        ("position", "integer"),
        ("type", "text"),
        ("passed", "boolean"),
        ("reason", "text"),
        ("detail", "jsonb"),
    ),
    "agent_calls": (
        ("run_id", "text"),
        ("case_id", "text"),
        ("turn", "integer"),
        ("position", "integer"),
        ("role", "text"),
        ("agent", "text"),
        ("latency_ms", "integer"),
        ("attempts", "integer"),
        ("status_code", "integer"),
        ("prompt_tokens", "integer"),
        ("completion_tokens", "integer"),
        ("total_tokens", "integer"),
        ("error", "text"),
    ),
    "turn_records": (
        ("run_id", "text"),
        ("case_id", "text"),
        ("position", "integer"),
        ("record", "text"),
        ("messages", "text"),
    ),
}
# The columns holding JSON: a row's value there is written as JSON text.
JSON_COLUMNS = frozenset(name for cols in ROW_COLUMNS.values() for name, t in cols if t == "jsonb")


def _names(table: str) -> str:
    return ", ".join(name for name, _ in ROW_COLUMNS[table])


# A row of each table, once: a copy of a step saved again inserts nothing.
INSERT = {
    table: f"INSERT INTO {table} ({_names(table)})"
    f" VALUES ({', '.join(':' + name for name, _ in columns)}) ON CONFLICT DO NOTHING"
    for table, columns in ROW_COLUMNS.items()
}

# -- saving a step on Postgres, in one statement ----------------------------------------------

# Postgres saves a step in one statement: the guarded UPDATE as a CTE, the turn,
# assertion, call and turn-record rows (passed as JSON arrays) inserted only if it moved
# the conversation on, and the run's counters when the case ends (`:b_ended`) or its
# spending when it goes on (`:b_spent`). One round trip instead of seven (BEGIN, UPDATE,
# four INSERTs, UPDATE, COMMIT): the database does the same work. Its row: the case id
# (none when the guard refused), then the ended run's counts (NULL unless it ended).
ROWS_PARAM = {
    "turns": "b_turn_rows",
    "assertion_results": "b_verdict_rows",
    "agent_calls": "b_call_rows",
    "turn_records": "b_record_rows",
}
_MOVED = "EXISTS (SELECT FROM moved)"


def _insert_if_moved(table: str) -> str:
    types = ", ".join(f"{name} {kind}" for name, kind in ROW_COLUMNS[table])
    return f"""inserted_{table} AS (INSERT INTO {table} ({_names(table)})
  SELECT {_names(table)}
  FROM jsonb_to_recordset(CAST(:{ROWS_PARAM[table]} AS jsonb)) AS new_{table}({types})
  WHERE {_MOVED} ON CONFLICT DO NOTHING)"""


_INSERTS_IF_MOVED = ",\n".join(_insert_if_moved(table) for table in ROW_COLUMNS)
POSTGRES_SAVE = f"""WITH moved AS ({SAVE_GUARDED}
  RETURNING case_id),
{_INSERTS_IF_MOVED},
forgotten AS ({FORGET_RECORDS} AND :b_ended AND {_MOVED}),
spent AS ({SPEND} AND :b_spent AND {_MOVED}),
ended AS ({_CASE_ENDED} AND :b_ended AND {_MOVED}
  RETURNING {_ENDED_COUNTS})
SELECT moved.case_id, ended.finished_cases, ended.total_cases, ended.status,
  ended.claimed_from, ended.started_cases
FROM moved LEFT JOIN ended ON true"""

# -- psycopg's placeholders -------------------------------------------------------------------

# A `:name` placeholder: not a `::` cast, not inside a word. (None of the statements here
# writes a cast with `::` or a colon inside a quoted string.)
_PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)")


@cache
def for_psycopg(statement: str) -> str:
    """`statement` with psycopg's placeholders: each `:name` as `%(name)s`."""
    assert "%" not in statement, "a literal % would need doubling for psycopg"
    return _PLACEHOLDER.sub(r"%(\1)s", statement)
