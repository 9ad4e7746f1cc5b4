"""The turn's read and write on Postgres, sent straight through the driver.

Every turn runs the same two statements (repo.load_case, repo.save_step). They are
built with SQLAlchemy Core like every other query, compiled once per process to SQL
text, and executed with the pooled connection's own psycopg cursor. SQLAlchemy still
provides the connection (the pool, autocommit, invalidation); what is skipped is its
per-execution work (compiled-cache lookup, execution context, events, result proxy),
which was about a tenth of a worker's CPU per turn (benchmarks/throughput.py).

Errors keep SQLAlchemy's shape: a driver error is raised as `DBAPIError`, and a lost
connection is invalidated, so that `reconnecting` (db.py) retries it and the pool
drops it exactly as for any other statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ClauseElement


@dataclass(frozen=True)
class CompiledStatement:
    """A statement as Postgres text with psycopg's named placeholders."""

    sql: str
    # Values the statement carries itself (literals in Core become bound parameters).
    defaults: Mapping[str, Any]
    # Parameters that are JSON documents: sent as jsonb, None as SQL NULL.
    json_params: frozenset[str]


def compile_statement(
    statement: ClauseElement, connection: Connection, json_params: frozenset[str]
) -> CompiledStatement:
    compiled = statement.compile(dialect=connection.dialect)
    defaults = {name: value for name, value in compiled.params.items() if value is not None}
    return CompiledStatement(compiled.string, defaults, json_params)


def fetch_one(
    connection: Connection, statement: CompiledStatement, params: Mapping[str, Any]
) -> tuple[Any, ...] | None:
    """Run `statement` on `connection`'s psycopg connection; its first row, if any."""
    import psycopg  # here: only a Postgres store needs it (keeps embedded start-up light)
    from psycopg.types.json import Jsonb

    values = dict(statement.defaults)
    for name, value in params.items():
        if name in statement.json_params and value is not None:
            value = Jsonb(value)
        values[name] = value
    driver: Any = connection.connection.driver_connection
    try:
        with driver.cursor() as cursor:
            cursor.execute(statement.sql, values)
            row = cursor.fetchone() if cursor.description is not None else None
    except psycopg.Error as exc:
        # What SQLAlchemy itself would decide and do for a statement it ran.
        error: Any = exc
        lost = bool(connection.dialect.is_disconnect(error, connection.connection, None))
        if lost:
            connection.invalidate(exc)
        raise DBAPIError.instance(
            statement.sql, values, exc, psycopg.Error, connection_invalidated=lost
        ) from exc
    return tuple(row) if row is not None else None
