"""What the store's query modules share: inserting rows once, the database's clock, the
tables as Core tables, and the JSON type that writes None as SQL NULL."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, ColumnElement, Table, func, literal
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from agenttest_worker.store.sql.models import Base, CaseRow, RunRow

# The tables as Core tables, for statements that skip the ORM.
CASES: Table = CaseRow.__table__  # type: ignore[assignment]
RUNS: Table = RunRow.__table__  # type: ignore[assignment]

# None must be SQL NULL (a case without a result yet), not the JSON value null.
JSON_OR_NULL = JSON(none_as_null=True)


def insert_ignoring(session: Session, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect of the session's database."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        # Imported only here: an embedded run on SQLite never loads the Postgres
        # dialect, whose import loads every Postgres driver module.
        from sqlalchemy.dialects import postgresql

        module: Any = postgresql
    else:
        module = sqlite
    # One statement executed for many rows (not a VALUES list per call): its compiled
    # form is cached, so a turn's inserts cost no SQL compilation.
    statement = module.insert(model.__table__).on_conflict_do_nothing()
    session.connection().execute(statement, list(rows))


def inserted(session: Session, model: type[Base], row: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING of one row: whether this insert stored it (read
    from RETURNING: the drivers' row counts of such an insert are not to be relied on)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql  # see insert_ignoring

        module: Any = postgresql
    else:
        module = sqlite
    table: Any = model.__table__
    statement = module.insert(table).values(row).on_conflict_do_nothing()
    key = next(iter(table.primary_key.columns))
    return session.connection().execute(statement.returning(key)).first() is not None


def ago(session: Session, seconds: float) -> ColumnElement[datetime]:
    """The instant `seconds` before now, by the database's clock where it has one.

    `updated_at` is written by the database (`now()`), so staleness is judged by the
    same clock: workers on hosts with skewed clocks still agree on what is stale.
    (SQLite's `now()` has whole seconds only: there, this process's clock.)
    """
    if session.get_bind().dialect.name == "postgresql":
        return func.now() - timedelta(seconds=seconds)
    return literal(datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=seconds))


def now(session: Session) -> ColumnElement[datetime]:
    return ago(session, 0)
