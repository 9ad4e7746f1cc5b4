"""Connections to the result store and bringing its schema up to date.

One code path for both databases: SQLite for the embedded default (WAL, so the
reporter can read while turns are written) and Postgres for fleets (psycopg 3).
`upgrade()` runs the Alembic migrations under a lock, so that several workers and a
submitter starting at once migrate the database exactly once.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from agenttest_worker.store.storable import dumps_storable

MIGRATIONS = Path(__file__).parent / "migrations"
# The schema revision this code reads and writes (tests/test_migrations.py checks it
# against Alembic's head): a database already there is recognized without Alembic.
HEAD_REVISION = "0017"
# Any constant works; it only has to be the same in every process.
_ADVISORY_LOCK_KEY = 0x61677474  # "agtt"


def normalize_url(url: str) -> str:
    """postgres:// and postgresql:// mean psycopg 3 here (not psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


# Closing an SQLite database's last connection checkpoints its write-ahead log into the
# database file and removes the log: done at exit for the engines still alive, rather
# than left to the connections' finalizers, which the interpreter's teardown need not
# run. Weak, so that an engine the cache dropped is freed.
_sqlite_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_sqlite_engines() -> None:
    for engine in list(_sqlite_engines):
        engine.dispose()


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    url = normalize_url(url)
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        _sqlite_engines.add(engine)
        return engine
    # No pre-ping: it cost a round trip per checkout, twice per turn. A connection the
    # server dropped fails its statement instead; `reconnecting` retries that.
    return create_engine(
        url,
        pool_size=20,
        max_overflow=0,
        pool_timeout=60,
        pool_recycle=1800,
        json_serializer=dumps_storable,  # see storable.py
    )


RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)

F = TypeVar("F", bound=Callable[..., Any])


def error_reason(exc: BaseException) -> str:
    """The first line of what the driver said (a one-line reason for a warning)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unstorable_reason(exc: BaseException) -> str | None:
    """The database's reason when it refused a value a step produced, else None.

    Postgres's data exceptions (SQLSTATE class 22: a number out of its column's range,
    text it cannot hold), psycopg refusing a parameter before sending it, SQLite an
    integer past 64 bits. Playing the step again would fail the same way every time,
    unlike a lost connection or a conflict.
    """
    orig = getattr(exc, "orig", None)
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(orig, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate.startswith("22"):
            return error_reason(exc)
        try:
            import psycopg  # here: an embedded (SQLite) run never needs it
        except ImportError:  # pragma: no cover - psycopg is a dependency
            return None
        if isinstance(orig, psycopg.DataError):
            return error_reason(exc)
        return None
    if isinstance(exc, StatementError) and isinstance(orig, OverflowError):
        return error_reason(exc)
    if isinstance(exc, OverflowError) and "SQLite" in str(exc):
        # A batch of rows (executemany) gets the driver's error itself, unwrapped.
        return error_reason(exc)
    if not isinstance(exc, StatementError) and isinstance(exc, ValueError | RecursionError):
        # The step could not even be written as JSON (pydantic's serializer refuses a
        # value nested past its limit): the same each time it would be played again.
        return error_reason(exc)
    return None


# SQLSTATEs of a server going away or not there yet besides class 08 (connection
# exception): admin_shutdown, crash_shutdown, cannot_connect_now ("the database system
# is starting up" / "shutting down").
_GONE_STATES = ("57P01", "57P02", "57P03")


def is_connection_lost(exc: DBAPIError) -> bool:
    """Whether `exc` says the database is unreachable (rather than the statement wrong).

    A dropped pooled connection marks the error `connection_invalidated`. While the
    server is still down (a restart takes a few seconds), opening a new connection
    fails instead, with the driver's error (`connection_lost`): that is the same outage,
    not a reason to give up on the first retry.
    """
    return exc.connection_invalidated or connection_lost(exc.orig)


def connection_lost(error: BaseException | None) -> bool:
    """Whether psycopg's `error` says the database is unreachable: an OperationalError
    with no SQLSTATE (refused, reset) or one of a server shutting down or starting up."""
    # Not imported here: where psycopg is not imported, it raised nothing.
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _GONE_STATES


# SQLSTATEs of a statement the server refused for now, not for what it writes, as a
# person reads them: a statement cancelled (statement_timeout), a lock not had in time
# (lock_timeout), transaction rollbacks (class 40), insufficient resources (class 53).
_REFUSALS = {
    "57014": "statement timeout",
    "55P03": "lock timeout",
    "40001": "serialization failure",
    "40P01": "deadlock",
    "53100": "disk full",
    "53200": "out of memory",
    "53300": "too many connections",
}
_REFUSAL_CLASSES = {"40": "transaction rolled back", "53": "insufficient resources"}
# SQLite's primary result codes of the same kind.
_SQLITE_REFUSALS = {5: "database busy", 6: "database locked", 10: "disk I/O error", 13: "disk full"}


def is_transient(exc: DBAPIError) -> bool:
    """Whether `exc` may pass if the same statement is sent again later: the connection
    lost, or the server refusing the statement for now (a statement timeout, a
    serialization failure, a deadlock, the disk full), rather than refusing what it
    holds."""
    return is_connection_lost(exc) or transient_refusal(exc.orig) is not None


def transient_refusal(error: BaseException | None) -> str | None:
    """What passing refusal the driver's `error` is ("disk full", "statement timeout"),
    or None: psycopg's errors by SQLSTATE, SQLite's by result code."""
    state = getattr(error, "sqlstate", None)
    if isinstance(state, str):
        return _REFUSALS.get(state) or _REFUSAL_CLASSES.get(state[:2])
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _SQLITE_REFUSALS.get(code & 0xFF)
    return None


# Told of every statement the server refuses for now (`reconnecting`), with the reason:
# a worker says so where a waiting submitter reads it (fleet/store_refusals.py).
RefusalListener = Callable[[str], None]
_refusal_listeners: list[RefusalListener] = []


def on_refusal(listener: RefusalListener) -> None:
    """Call `listener(reason)` whenever `reconnecting` retries a refused statement."""
    if listener not in _refusal_listeners:
        _refusal_listeners.append(listener)


def _tell_refusal(reason: str) -> None:
    for listener in list(_refusal_listeners):
        try:
            listener(reason)
        except Exception:  # saying so must never stop the retry
            continue


def _retry_delay(exc: DBAPIError, tries: _Tries) -> float | None:
    """How long to wait before trying `exc`'s statement again, or None: give up."""
    refusal = None if is_connection_lost(exc) else transient_refusal(exc.orig)
    if refusal is None:
        if not is_connection_lost(exc) or tries.lost >= len(RECONNECT_DELAYS):
            return None
        tries.lost += 1
        return RECONNECT_DELAYS[tries.lost - 1]
    now = time.monotonic()
    if tries.refused_until is None:
        tries.refused_until = now + _refusal_patience()
    if now >= tries.refused_until:
        return None
    _tell_refusal(f"{refusal} ({error_reason(exc)})")
    delay = RECONNECT_DELAYS[min(tries.refused, len(RECONNECT_DELAYS) - 1)]
    tries.refused += 1
    return min(delay, tries.refused_until - now)


class _Tries:
    """A `reconnecting` call's retries so far."""

    __slots__ = ("lost", "refused", "refused_until")

    def __init__(self) -> None:
        self.lost = 0
        self.refused = 0
        self.refused_until: float | None = None


def _refusal_patience() -> float:
    # Here: settings are read only once a statement was refused.
    from agenttest_worker.settings import get_settings

    return get_settings().store_retry_seconds


def reconnecting(fn: F) -> F:
    """Retry `fn` when the database connection was lost (a restart, a failover), or the
    server refused its statement for now (`is_transient`: a statement timeout, a
    serialization failure, a deadlock, the disk full).

    Only for functions safe to run again: the hot path's reads, and writes guarded so
    that a second attempt of a write that did land changes nothing. A lost connection is
    given up on (raised) after about 16 s of trying; past that, the stall sweeper brings
    the conversation back (fleet/sweeper.py). A refused statement is tried again for
    AGENTTEST_STORE_RETRY_SECONDS: a step played is saved once the store takes it,
    without its agents being called again.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_attempts, "retry", False)
        tries = _Tries()
        try:
            while True:
                try:
                    return fn(*args, **kwargs)
                except DBAPIError as exc:
                    delay = _retry_delay(exc, tries)
                    if delay is None:
                        raise
                    time.sleep(delay)
                    _attempts.retry = True
        finally:
            _attempts.retry = outer

    return wrapper  # type: ignore[return-value]


_attempts = threading.local()


def retrying() -> bool:
    """Inside a `reconnecting` function: whether this is a retry after a lost connection.

    The connection can drop after the server committed the earlier attempt's write but
    before it said so; a guarded write that finds its guard already moved on may then be
    looking at its own work.
    """
    return bool(getattr(_attempts, "retry", False))


@lru_cache(maxsize=8)
def _session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session committed on success and rolled back on any error."""
    session = _session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


_upgraded: set[str] = set()
_upgrade_lock = threading.Lock()


def current_revision(connection: Any) -> str | None:
    """The schema revision recorded in the database, or None for an empty database."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return str(version) if version is not None else None


def upgrade(url: str) -> None:
    """Bring the database at `url` to the current schema (idempotent, safe concurrently)."""
    if url in _upgraded:
        return  # every task asks: answered without parsing the URL again
    given, url = url, normalize_url(url)
    with _upgrade_lock:
        if url in _upgraded:
            _upgraded.add(given)
            return
        engine = get_engine(url)
        with engine.connect() as connection:
            current = current_revision(connection)
        if current is None and is_sqlite(url):
            _create_fresh(url, engine)
        elif current != HEAD_REVISION:
            _migrate(url, engine)
        _upgraded.update((url, given))


def _create_fresh(url: str, engine: Engine) -> None:
    """A new embedded database: the models' tables at the head revision, directly.

    The same schema the migrations build (tests/test_migrations.py compares them),
    without importing Alembic for what is most often a one-off local run.
    """
    # Here: this module is also imported just to judge an
    # error (services.py, driver/step.py) or to find the database current.
    from agenttest_worker.store.sql.models import Base

    with _migration_lock(url, engine) as connection:
        if current_revision(connection) is not None:
            return  # another process got there first
        Base.metadata.create_all(connection)
        connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        connection.execute(
            text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": HEAD_REVISION}
        )


def _migrate(url: str, engine: Engine) -> None:
    # Here: Alembic is needed only when the schema is not current.
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    with _migration_lock(url, engine) as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextmanager
def _migration_lock(url: str, engine: Engine) -> Iterator[Any]:
    if is_sqlite(url):
        database = make_url(url).database or ":memory:"
        lock_path = Path(database + ".migrate.lock") if database != ":memory:" else None
        handle = lock_path.open("a") if lock_path else None
        try:
            if handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
            with engine.begin() as connection:
                yield connection
        finally:
            if handle:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
        return
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
        connection.commit()
        try:
            with connection.begin():
                yield connection
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_LOCK_KEY})
            connection.commit()
