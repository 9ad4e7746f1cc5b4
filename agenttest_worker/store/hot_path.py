"""The turn's reads and writes, sent straight through the driver on Postgres.

Every turn runs the same few statements (turns.load_case, turns.save_step). They are
built with SQLAlchemy Core like every other query, compiled once per process to SQL
text with Postgres's own `$n` placeholders, and executed with a pooled psycopg
connection's own raw cursor (psycopg.RawCursor), in autocommit (each is one atomic
statement: a transaction would only add BEGIN and COMMIT round trips). The raw
cursor sends the text as it is: psycopg's ordinary cursor rewrites `%(name)s`
placeholders at every execution, from a cache that skips statements over 4 KB, as
the step that ends a conversation is (~150 µs a save, against ~7 µs here).
SQLAlchemy still provides the pool (checkout, checkin, invalidation); what is skipped
is its per-connection and per-execution work: a `Connection` object, setting and
resetting the isolation level at every checkout, the compiled-cache lookup, the
execution context, events and the result proxy. Together that was about a tenth of a
worker's CPU per turn (benchmarks/throughput.py).

Errors keep SQLAlchemy's shape: a driver error is raised as `DBAPIError`, and a lost
connection is invalidated, so that `reconnecting` (db.py) retries it and the pool
drops it exactly as for any other statement.

Elsewhere (SQLite, embedded) the same statements go through an ordinary SQLAlchemy
connection: `turn_connection` hides which.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from sqlalchemy import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from agenttest_worker.store.steps import JsonText
from agenttest_worker.store.storable import dumps_storable, storable_json

# psycopg is imported where it is used, on Postgres only: importing it costs ~0.1 s that
# an embedded (SQLite) run never needs.

# How a JSON parameter is sent: as `json` (kept as its text: a json column) or `jsonb`.
JsonKind = Literal["json", "jsonb"]


class TurnConnection(Protocol):
    """Runs one of the turn's statements (each returns rows); its first row, if any."""

    def fetch_one(
        self, statement: ClauseElement, params: Mapping[str, Any]
    ) -> tuple[Any, ...] | None: ...


@dataclass(frozen=True)
class CompiledStatement:
    """A statement as Postgres text with `$n` placeholders, and the names of its
    parameters in their order."""

    sql: bytes
    order: tuple[str, ...]
    # Values the statement carries itself (literals in Core become bound parameters).
    defaults: Mapping[str, Any]

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """The statement's parameters in order: `params`, else its own values."""
        return [params[name] if name in params else self.defaults[name] for name in self.order]


# Compiled once per process, by statement (the statements are module constants).
_compiled: dict[ClauseElement, CompiledStatement] = {}


def _numbered(dialect: Dialect) -> Dialect:
    """`dialect` (the engine's, as its first connection set it up) writing `$n`
    placeholders: SQLAlchemy's compiler takes its placeholders from these two."""
    numbered = copy.copy(dialect)
    numbered.paramstyle = "numeric_dollar"
    numbered.positional = True
    return numbered


def _compile(statement: ClauseElement, engine: Engine) -> CompiledStatement:
    compiled = _compiled.get(statement)
    if compiled is None:
        text = statement.compile(dialect=_numbered(engine.dialect))
        assert isinstance(text, SQLCompiler)  # the turn's statements are all SQL ones
        defaults = {name: value for name, value in text.params.items() if value is not None}
        order = tuple(text.positiontup or ())
        compiled = CompiledStatement(text.string.encode(), order, defaults)
        _compiled[statement] = compiled
    return compiled


class _DriverConnection:
    """A pooled psycopg connection running compiled statements itself."""

    def __init__(self, engine: Engine, pooled: Any, json_params: Mapping[str, JsonKind]) -> None:
        self.engine = engine
        self.pooled = pooled
        self.json_params = json_params

    def fetch_one(
        self, statement: ClauseElement, params: Mapping[str, Any]
    ) -> tuple[Any, ...] | None:
        import psycopg  # Postgres only (see the imports above)
        from psycopg import RawCursor
        from psycopg.types.json import Json, Jsonb

        compiled = _compile(statement, self.engine)
        sent = dict(params)
        for name, value in params.items():
            kind = self.json_params.get(name)
            if kind is not None and value is not None:
                # Sent with its own type: a jsonb value cast to a json column would
                # arrive with its keys reordered.
                wrapper = Json if kind == "json" else Jsonb
                if isinstance(value, JsonText):
                    sent[name] = wrapper(value, dumps=storable_json)
                else:
                    sent[name] = wrapper(value, dumps=dumps_storable)
        values = compiled.values(sent)
        try:
            with RawCursor(self.pooled.driver_connection) as cursor:
                cursor.execute(compiled.sql, values)
                # Every turn statement returns rows (a SELECT, or RETURNING): asking
                # the cursor for its description first cost ~1.5% of a worker's CPU.
                row = cursor.fetchone()
        except psycopg.Error as exc:
            raise _as_dbapi_error(
                self.engine, exc, self.pooled, compiled.sql.decode(), values
            ) from exc
        return tuple(row) if row is not None else None


class SqlAlchemyTurnConnection:
    """One of SQLAlchemy's connections, as a TurnConnection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def fetch_one(
        self, statement: ClauseElement, params: Mapping[str, Any]
    ) -> tuple[Any, ...] | None:
        row = self.connection.execute(statement, dict(params)).first()  # type: ignore[call-overload]
        return tuple(row) if row is not None else None


def _as_dbapi_error(
    engine: Engine, exc: Exception, pooled: Any, sql: str | None, values: Any
) -> DBAPIError:
    """What SQLAlchemy itself would raise for `exc`, invalidating a lost connection."""
    import psycopg  # Postgres only (see the imports above)

    error: Any = exc
    lost = bool(engine.dialect.is_disconnect(error, pooled, None))
    if lost and pooled is not None:
        pooled.invalidate(exc)
    wrapped = DBAPIError.instance(sql, values, exc, psycopg.Error, connection_invalidated=lost)
    return cast(DBAPIError, wrapped)  # a DBAPIError for a driver's error


@contextmanager
def turn_connection(
    engine: Engine, json_params: Mapping[str, JsonKind]
) -> Iterator[TurnConnection]:
    """A connection for the turn's statements, each committed on its own.

    On Postgres a pooled psycopg connection in autocommit (`json_params` are sent as
    json or jsonb as they say, None as SQL NULL, a steps.JsonText as written; NUL
    characters replaced, see storable.py), given back to the pool in its usual mode;
    elsewhere a SQLAlchemy connection in autocommit.
    """
    if engine.dialect.name != "postgresql":
        with engine.connect() as plain:
            plain = plain.execution_options(isolation_level="AUTOCOMMIT")
            yield SqlAlchemyTurnConnection(plain)
        return
    import psycopg  # Postgres only (see the imports above)

    try:
        pooled = engine.raw_connection()
    except psycopg.Error as exc:  # cannot connect: the same error `engine.connect()` raises
        raise _as_dbapi_error(engine, exc, None, None, None) from exc
    try:
        driver: Any = pooled.driver_connection
        driver.autocommit = True  # psycopg's own flag: no round trip
        yield _DriverConnection(engine, pooled, json_params)
    finally:
        if pooled.is_valid:
            try:
                # Sessions that check this connection out next expect transactions.
                driver.autocommit = False
            except psycopg.Error as exc:  # e.g. broken mid-statement: not reusable
                pooled.invalidate(exc)
        pooled.close()
