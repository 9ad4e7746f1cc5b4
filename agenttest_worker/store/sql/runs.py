"""A run's lifecycle: created, its cases stored, started, read, cancelled, removed.

A run is `pending` while its submitter stores its cases (conversations may already
start), `running` once `start_run` knows their number, then `aggregating` and `done`
(results.py). Its conversations' steps are saved by turns.py. The submitter's side of
storing a new run (its cases a batch at a time, each started as it is stored) is
agenttest_submit/run/storing.py.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.exc import DBAPIError

from agenttest_worker.case_definitions import CaseDefinition, case_definition
from agenttest_worker.store.sql.db import is_sqlite, session_scope
from agenttest_worker.store.sql.models import (
    AgentCallRow,
    AgentSpanRow,
    AssertionResultRow,
    CaseRow,
    RunRow,
    TurnRow,
)
from agenttest_worker.store.sql.shared import insert_ignoring
from agenttest_worker.store.sql.turn_statements import CLAIM_STARTS
from agenttest_worker.store.steps import CaseText, claimed
from agenttest_worker.store.storable import dumps_storable, storable_json, storable_row

if TYPE_CHECKING:
    from psycopg import Connection

# Batches of cases a run's submitter stores at once on Postgres, each on its own
# connection: enough to keep a two-core server busy (agenttest_submit/run/storing.py).
POSTGRES_WRITERS = 2


def submitted_by() -> str:
    """Who submits a run: user@host."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


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
    suite: str | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """`usage`: what the run used before it was stored (its generators; store/sql/usage.py)."""
    texts = {
        "submitted_by": submitted_by(),
        "agent": agent,
        "input_label": input_label,
        "suite": suite,
    }
    if not is_sqlite(url):
        texts = storable_row(texts)  # Postgres text holds no NUL (storable.py)
    with session_scope(url) as session:
        session.add(
            RunRow(
                id=run_id,
                # Set here rather than by the database: SQLite's CURRENT_TIMESTAMP has
                # whole seconds, and `latest_run` ("last") must tell apart two runs
                # submitted within one second (their ids then sort at random).
                created_at=datetime.now(UTC),
                status="pending",
                options=options,
                config=config,
                parent_run_id=parent_run_id,
                deadline_at=deadline_at,
                usage=usage,
                **texts,
            )
        )


def add_cases(url: str, run_id: str, cases: Iterable[NewCase]) -> int:
    batch = list(cases)
    if not is_sqlite(url):
        # Here, not at the top: an embedded run (SQLite) never imports the driver.
        from psycopg import Error

        try:
            with session_scope(url) as session:
                driver = session.connection().connection.driver_connection
                assert driver is not None  # a live connection of this session's transaction
                return write_cases(driver, run_id, batch)
        except Error as exc:
            # The driver's own error, raised as SQLAlchemy would have wrapped it: callers
            # tell a refused value from a lost connection by DBAPIError (db.py).
            raise DBAPIError.instance(COPY_CASES, None, exc, Error) from exc
    with session_scope(url) as session:
        rows = [
            {
                "run_id": run_id,
                "case_id": c.case_id,
                "test_id": c.test_id,
                "seq": c.seq,
                "case": json.loads(c.case.text) if isinstance(c.case, CaseText) else c.case,
                "agent": c.agent,
                "phase": "pending",
                "next_turn": 1,
                "deliveries": 0,
                "definition_hash": definition.hash,
                "assertion_hashes": definition.as_dict(),
            }
            for c in batch
            for definition in (c.definition(),)
        ]
        insert_ignoring(session, CaseRow, rows)
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


def claim_starts(url: str, run_id: str, parallel: int | None = None) -> tuple[int, int] | None:
    """Claim the free slots of a run capped by --parallel (setting the cap when given):
    the seq range first..last of the conversations to start now, or None.

    The submitter claims the first `parallel` once the run is running; after that the
    step that ends a conversation claims the next in the statement that counts the end
    (turn_statements.CASE_ENDED), and a sweeper claims what a stopped run left (a run
    cancelled while none of its conversations was under way). Each claim moves
    `started_cases` under the run row's lock, so no conversation is claimed twice.
    """
    with session_scope(url) as session:
        if parallel is not None:
            session.execute(update(RunRow).where(RunRow.id == run_id).values(parallel=parallel))
        row = session.execute(text(CLAIM_STARTS), {"b_run": run_id}).one_or_none()
    return None if row is None else claimed(row[0], row[1])


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


def release_parked(url: str, run_id: str) -> list[tuple[str, int]]:
    """(case_id, next_turn) of a cancelled run's conversations parked for a person, now
    ready again: their next step ends them skipped with the run's reason, as any other
    (a person's reply saved meanwhile finds them moved and is dropped). Nothing for a
    run that is not cancelled."""
    with session_scope(url) as session:
        cancelled = session.scalar(select(RunRow.cancelled).where(RunRow.id == run_id))
        if not cancelled:
            return []
        released = session.execute(
            update(CaseRow)
            .where(CaseRow.run_id == run_id, CaseRow.phase == "awaiting_human")
            .values(phase="ready")
            .returning(CaseRow.case_id, CaseRow.next_turn)
        )
        return [(case_id, int(turn)) for case_id, turn in released]


def promote_run(url: str, run_id: str) -> bool:
    """Make the run its suite's baseline (`--baseline suite` prefers it); whether the
    run exists."""
    with session_scope(url) as session:
        result = session.execute(
            update(RunRow).where(RunRow.id == run_id).values(promoted_at=func.now())
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def record_gate(url: str, run_id: str, passed: bool) -> None:
    """Keep what the run's --fail-on decided: a run that failed its gate is never
    taken as a baseline (run_history.suite_baseline)."""
    with session_scope(url) as session:
        gate = "passed" if passed else "failed"
        session.execute(update(RunRow).where(RunRow.id == run_id).values(gate=gate))


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
        session.execute(delete(AgentSpanRow).where(AgentSpanRow.run_id == run_id))
        session.execute(delete(RunRow).where(RunRow.id == run_id))


def keep_statistics(url: str, total: int) -> None:
    """Have Postgres plan with statistics that know a run of `total` cases (see
    `statistics_behind`); nothing on SQLite, whose planner finds a row by its primary
    key without statistics."""
    if is_sqlite(url):
        return
    with session_scope(url) as session:
        if statistics_behind(session.execute(text(KNOWN_CASES)).first(), total):
            session.execute(text(ANALYZE_CASES))


# Not frozen, for the same reason as cases.validation.Located: one per case stored.
@dataclass(slots=True)
class NewCase:
    seq: int
    case_id: str
    # The normalized record, or its text as the submitter's spool holds it.
    case: dict[str, Any] | CaseText
    agent: str | None

    @property
    def test_id(self) -> str | None:
        """A repetition's case id (the record says which repetition it is); else None."""
        if isinstance(self.case, CaseText):
            return self.case.test_id
        return self.case.get("id") if "repetition" in self.case else None

    def definition(self) -> CaseDefinition:
        """The hashes of the case's definition (case_definitions.py)."""
        if isinstance(self.case, CaseText):
            if self.case.definition is not None:
                return self.case.definition
            return case_definition(json.loads(self.case.text))
        return case_definition(self.case)


def copy_escaped(piece: str) -> str:
    """`piece` as a field of COPY's text format (a NUL, which Postgres text cannot hold,
    as U+FFFD, like the records it comes from)."""
    return (
        piece.replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
        .replace("\x00", "\ufffd")
    )


# On Postgres a batch of cases is written with COPY, each case's record as the text the
# spool holds: the server neither parses, plans nor answers a statement per row, nor
# takes the batch apart as a JSON array (the INSERT ... SELECT over
# json_array_elements below, which took ~40% longer per batch and the submitter
# twice the CPU: benchmarks/RESULTS.md, "Submission, 2026-12-02, later"). The columns
# and values are the ORM insert's (its defaults written out).
COPY_CASES = (
    'COPY cases (run_id, case_id, test_id, seq, "case", agent, phase, next_turn,'
    " deliveries, reserved_tokens, reserved_cost, definition_hash, assertion_hashes)"
    " FROM STDIN"
)

# COPY has no conflict rule: a batch holding a case already stored (never one the
# submitter writes: its ids are checked unique, its run new) is written again with this
# statement, which keeps the stored row, as the ORM insert would.
ADD_CASES = (
    'INSERT INTO cases (run_id, case_id, test_id, seq, "case", agent, phase, next_turn,'
    " deliveries, reserved_tokens, reserved_cost, definition_hash, assertion_hashes)"
    " SELECT %(run_id)s, e->>0, e->>1, CAST(e->>2 AS integer), e->4, e->>3,"
    " 'pending', 1, 0, 0, 0, e->>5, CAST(e->6 AS jsonb)"
    " FROM json_array_elements(CAST(%(cases)s AS json)) AS e"
    " ON CONFLICT DO NOTHING"
)


def record_text(case: NewCase) -> str:
    """The case's record as the column's type writes it (storable.py), or as given."""
    if isinstance(case.case, CaseText):
        return storable_json(case.case.text)
    return dumps_storable(case.case)


def _case_element(case: NewCase) -> str:
    """[case id, test id, seq, agent, record, definition hash, assertion hashes] as JSON
    (for `ADD_CASES`)."""
    head = json.dumps([case.case_id, case.test_id, case.seq, case.agent])
    definition = case.definition()
    tail = json.dumps([definition.hash, definition.as_dict()])
    return f"{head[:-1]}, {record_text(case)}, {tail[1:]}"


def _copy_value(value: str | None) -> str:
    return "\\N" if value is None else copy_escaped(value)


def copy_rows(run_id: str, batch: Sequence[NewCase]) -> str:
    """The batch as COPY's text format, one line per case (see `COPY_CASES`)."""
    run = copy_escaped(run_id)
    return "".join(
        f"{run}\t{copy_escaped(c.case_id)}\t{_copy_value(c.test_id)}\t{c.seq}\t"
        f"{copy_escaped(record_text(c))}\t{_copy_value(c.agent)}\tpending\t1\t0\t0\t0\t"
        f"{d.hash}\t{copy_escaped(json.dumps(d.as_dict()))}\n"
        for c in batch
        for d in (c.definition(),)
    )


def write_cases(connection: Connection[Any], run_id: str, batch: Sequence[NewCase]) -> int:
    """Store `batch` on a psycopg connection, in a transaction of its own (a savepoint
    inside one already open); the number of cases given."""
    from psycopg.errors import UniqueViolation  # psycopg: only where Postgres is used

    try:
        with (
            connection.transaction(),
            connection.cursor() as cursor,
            cursor.copy(COPY_CASES) as copy,
        ):
            copy.write(copy_rows(run_id, batch))
        return len(batch)
    except UniqueViolation:
        pass  # a case already stored: see `ADD_CASES`
    document = "[" + ", ".join(map(_case_element, batch)) + "]"
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute(ADD_CASES, {"run_id": run_id, "cases": document})
    return len(batch)


# Postgres plans each conversation's statements (its load, its step's save) by the
# cases table's statistics. Without any (a table never analyzed: a new database, or
# autovacuum off) or with statistics from before a run larger than all the table held,
# every index leading with run_id looks like one row, and Postgres may take the smallest
# instead of the primary key: each statement then reads every case of the run, and a
# run of 10,000 conversations in flight kept the database's core busy with its own
# saves (benchmarks/RESULTS.md). A run that outnumbers what the statistics know has the
# table analyzed once it has started (its conversations replan as it commits).
# (reltuples: the rows the statistics know; -1 for none.)
KNOWN_CASES = "SELECT reltuples FROM pg_class WHERE oid = to_regclass('cases')"
ANALYZE_CASES = "ANALYZE cases"


def statistics_behind(known: Any, total: int) -> bool:
    """Whether statistics knowing `known` cases (KNOWN_CASES's row) are behind a run of
    `total` (see above)."""
    return known is not None and float(known[0]) < total
