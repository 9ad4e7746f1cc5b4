"""Connections to the result store and bringing its schema up to date.

One code path for both databases: SQLite for the embedded default (WAL, so the
reporter can read while turns are written) and Postgres for fleets (psycopg 3).
`upgrade()` runs the Alembic migrations under a lock, so that several workers and a
submitter starting at once migrate the database exactly once.
"""

from __future__ import annotations

import fcntl
import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"
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


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    url = normalize_url(url)
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # No pre-ping: it cost a round trip per checkout, twice per turn. A connection the
    # server dropped fails its statement instead; `reconnecting` retries that.
    return create_engine(url, pool_size=20, max_overflow=0, pool_timeout=60, pool_recycle=1800)


RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)

F = TypeVar("F", bound=Callable[..., Any])


def reconnecting(fn: F) -> F:
    """Retry `fn` when the database connection was lost (a restart, a failover).

    Only for functions safe to run again: the hot path's reads, and writes guarded so
    that a second attempt of a write that did land changes nothing. Gives up (and
    raises) after about 16 s of trying.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for delay in (*RECONNECT_DELAYS, None):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as exc:
                if not exc.connection_invalidated or delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    return wrapper  # type: ignore[return-value]


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


def upgrade(url: str) -> None:
    """Bring the database at `url` to the current schema (idempotent, safe concurrently)."""
    from alembic import command
    from alembic.config import Config

    url = normalize_url(url)
    with _upgrade_lock:
        if url in _upgraded:
            return
        engine = get_engine(url)
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        with _migration_lock(url, engine) as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
        _upgraded.add(url)


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
