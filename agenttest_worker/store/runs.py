"""A run's lifecycle: created, its cases stored, started, read, cancelled, removed.

A run is `pending` while its submitter stores its cases (conversations may already
start), `running` once `start_run` knows their number, then `aggregating` and `done`
(results.py). Its conversations' steps are saved by turns.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, text, update
from sqlalchemy.exc import DBAPIError

from agenttest_worker.store._sql import insert_ignoring
from agenttest_worker.store.db import is_sqlite, session_scope
from agenttest_worker.store.models import AgentCallRow, AssertionResultRow, CaseRow, RunRow, TurnRow
from agenttest_worker.store.new_run import (
    ANALYZE_CASES,
    COPY_CASES,
    KNOWN_CASES,
    POSTGRES_WRITERS,
    NewRun,
    statistics_behind,
    submitted_by,
    write_cases,
)
from agenttest_worker.store.new_run import NewCase as NewCase  # where callers found it
from agenttest_worker.store.steps import CaseText, claimed
from agenttest_worker.store.turn_statements import CLAIM_STARTS


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
    """`usage`: what the run used before it was stored (its generators; store/usage.py)."""
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
                suite=suite,
                usage=usage,
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
            }
            for c in batch
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


class SqlAlchemyRunWrites:
    """A new run's writes (new_run.RunWrites) through this module: on SQLite, and on a
    Postgres URL naming a driver other than psycopg 3 (postgres_run.py otherwise)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # SQLite takes one writer at a time.
        self.writers = 1 if is_sqlite(url) else POSTGRES_WRITERS

    def create_run(self, run: NewRun) -> None:
        create_run(
            self.url,
            run_id=run.run_id,
            agent=run.agent,
            input_label=run.input_label,
            options=run.options,
            config=run.config,
            parent_run_id=run.parent_run_id,
            deadline_at=run.deadline_at,
            suite=run.suite,
            usage=run.usage,
        )

    def add_cases(self, run_id: str, batch: Sequence[NewCase]) -> int:
        return add_cases(self.url, run_id, batch)

    def start_run(self, run_id: str, total: int, started_at: datetime | None = None) -> bool:
        return start_run(self.url, run_id, total, started_at)

    def delete_run(self, run_id: str) -> None:
        delete_run(self.url, run_id)

    def keep_statistics(self, total: int) -> None:
        """new_run.statistics_behind, on Postgres (SQLite's planner finds a row by its
        primary key without statistics)."""
        if is_sqlite(self.url):
            return
        with session_scope(self.url) as session:
            if statistics_behind(session.execute(text(KNOWN_CASES)).first(), total):
                session.execute(text(ANALYZE_CASES))

    def close(self) -> None:
        pass
