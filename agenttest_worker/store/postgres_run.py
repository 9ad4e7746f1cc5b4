"""Storing a new run on Postgres through psycopg alone: a submitter's way to its first
conversation.

A fleet's submitter imported SQLAlchemy, its ORM and the store's models only to write
one run row, its cases (with COPY, already psycopg's own) and one update: about 40% of
the instructions of a 300-case `--no-wait` submission (benchmarks/RESULTS.md), all of it
before a worker could take the run's first conversation. Here those statements are
psycopg's: the run row with the columns and defaults of the models' insert
(tests/test_postgres_run.py holds both to the same row), the cases as runs.add_cases
writes them (new_run.write_cases), the start as runs.start_run moves the run. The
schema is checked with one query; a database not at the head revision is brought there
by db.upgrade (Alembic) first.

psycopg is imported where a connection is made: storing.py imports this module to ask
`libpq_url` about any URL, SQLite's included.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agenttest_worker.store.new_run import (
    ANALYZE_CASES,
    KNOWN_CASES,
    POSTGRES_WRITERS,
    NewCase,
    NewRun,
    statistics_behind,
    submitted_by,
    write_cases,
)
from agenttest_worker.store.schema_revision import HEAD_REVISION
from agenttest_worker.store.storable import dumps_storable

if TYPE_CHECKING:
    from psycopg import Connection

# The spellings db.normalize_url takes for Postgres through psycopg 3.
_PSYCOPG_SCHEMES = ("postgres://", "postgresql://", "postgresql+psycopg://")


def libpq_url(url: str) -> str | None:
    """`url` as libpq reads it when it names Postgres through psycopg 3; else None (the
    SQLAlchemy store writes the run)."""
    lowered = url.lower()
    for scheme in _PSYCOPG_SCHEMES:
        if lowered.startswith(scheme):
            return "postgresql://" + url[len(scheme) :]
    return None


# The models' insert of a new run (models.RunRow): every column it writes, with the
# defaults it fills in. JSON documents are written as dumps_storable writes them, None
# as JSON null, as the models' JSON type does.
_CREATE_RUN = (
    "INSERT INTO runs (id, created_at, status, submitted_by, agent, input_label, options,"
    " config, parent_run_id, total_cases, finished_cases, passed, failed, skipped,"
    " total_turns, total_tokens, total_cost, cancelled, deadline_at, started_cases,"
    " claimed_from, reserved_tokens, reserved_cost, budget_turns, suite, usage)"
    " VALUES (%(id)s, %(created_at)s, 'pending', %(submitted_by)s, %(agent)s,"
    " %(input_label)s, CAST(%(options)s AS jsonb), CAST(%(config)s AS jsonb),"
    " %(parent_run_id)s, 0, 0, 0, 0, 0, 0, 0, 0.0, false, %(deadline_at)s, 0, 0, 0, 0.0, 0,"
    " %(suite)s, CAST(%(usage)s AS jsonb))"
)
_START_RUN = (
    "UPDATE runs SET status = 'running', total_cases = %(total)s, started_at = %(started_at)s"
    " WHERE id = %(id)s RETURNING finished_cases"
)
# runs.delete_run's order (see there): the cases first.
_DELETE_RUN = (
    "DELETE FROM cases WHERE run_id = %(id)s",
    "DELETE FROM turns WHERE run_id = %(id)s",
    "DELETE FROM assertion_results WHERE run_id = %(id)s",
    "DELETE FROM agent_calls WHERE run_id = %(id)s",
    "DELETE FROM runs WHERE id = %(id)s",
)


# SQLSTATEs of a server going away or not there yet besides class 08 (connection
# exception): admin_shutdown, crash_shutdown, cannot_connect_now ("the database system
# is starting up" / "shutting down").
_GONE_STATES = ("57P01", "57P02", "57P03")


def connection_lost(error: BaseException) -> bool:
    """Whether psycopg's `error` says the database is unreachable (rather than the
    statement wrong): a connection refused or reset has no SQLSTATE; a server shutting
    down or starting up has one of its own."""
    # Not imported here: where psycopg is not imported, it raised nothing.
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _GONE_STATES


def _text(value: str | None) -> str | None:
    """A text value as Postgres can hold it (no NUL: storable.py)."""
    return None if value is None else value.replace("\x00", "\ufffd")


class PostgresRunWrites:
    """A new run's writes (new_run.RunWrites), each on a connection of its own while it
    runs (the cases are stored by more than one thread at once: storing.py); every
    connection is closed by `close`."""

    writers = POSTGRES_WRITERS

    def __init__(self, url: str) -> None:
        self._url = url
        self._idle: queue.SimpleQueue[Connection[Any]] = queue.SimpleQueue()
        self._opened: list[Connection[Any]] = []

    @contextmanager
    def _connection(self) -> Iterator[Connection[Any]]:
        try:
            connection = self._idle.get_nowait()
        except queue.Empty:
            import psycopg  # here: see the module's docstring

            connection = psycopg.connect(self._url, autocommit=True)
            self._opened.append(connection)
        yield connection
        # Not after an error: a connection that failed is not used again.
        self._idle.put(connection)

    def revision(self) -> str | None:
        """The schema revision the database records, or None for an empty database."""
        with self._connection() as connection:
            found = connection.execute("SELECT to_regclass('alembic_version')").fetchone()
            if found is None or found[0] is None:
                return None
            version = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        return None if version is None else str(version[0])

    def current_schema(self) -> bool:
        """Whether the database is at the head revision (else db.upgrade must run)."""
        return self.revision() == HEAD_REVISION

    def create_run(self, run: NewRun) -> None:
        with self._connection() as connection:
            connection.execute(
                _CREATE_RUN,
                {
                    "id": run.run_id,
                    # Set here, as runs.create_run does (see there).
                    "created_at": datetime.now(UTC),
                    "submitted_by": _text(submitted_by()),
                    "agent": _text(run.agent),
                    "input_label": _text(run.input_label),
                    "options": dumps_storable(run.options),
                    "config": dumps_storable(run.config),
                    "parent_run_id": run.parent_run_id,
                    "deadline_at": run.deadline_at,
                    "suite": _text(run.suite),
                    "usage": dumps_storable(run.usage),
                },
            )

    def add_cases(self, run_id: str, batch: Sequence[NewCase]) -> int:
        with self._connection() as connection:
            return write_cases(connection, run_id, batch)

    def start_run(self, run_id: str, total: int, started_at: datetime | None = None) -> bool:
        """runs.start_run: the run running with `total` cases; whether they all ended."""
        with self._connection() as connection:
            found = connection.execute(
                _START_RUN,
                {"id": run_id, "total": total, "started_at": started_at or datetime.now(UTC)},
            ).fetchone()
        if found is None:
            raise LookupError(f"run {run_id} is not in the store")
        return bool(found[0] >= total)

    def delete_run(self, run_id: str) -> None:
        """runs.delete_run: a run whose cases could not all be stored."""
        with self._connection() as connection, connection.transaction():
            for statement in _DELETE_RUN:
                connection.execute(statement, {"id": run_id})

    def keep_statistics(self, total: int) -> None:
        """new_run.statistics_behind: the cases table analyzed when they are."""
        with self._connection() as connection:
            if statistics_behind(connection.execute(KNOWN_CASES).fetchone(), total):
                connection.execute(ANALYZE_CASES)

    def close(self) -> None:
        for connection in self._opened:
            connection.close()
