"""Saying plainly that the database or the broker is out of reach.

A submission that cannot reach AGENTTEST_DATABASE_URL or AGENTTEST_BROKER_URL is not a
bug in agenttest; it must say which service, at which address (password hidden), and
what the driver said, in one line instead of an "internal error" with the driver's
exception class. Exit code 3 either way: nothing about the cases was wrong.

Only the modules a run has already imported are consulted (SQLAlchemy, psycopg, kombu),
so this costs the command's start-up nothing. `safe_url` is also how the subcommands
show the database's address.
"""

from __future__ import annotations

import sys

from agenttest_worker.settings import get_settings


def safe_url(url: str) -> str:
    """`url` as it may be shown: its password replaced by ***."""
    from sqlalchemy.engine import make_url  # SQLAlchemy only when a URL is shown

    return make_url(url).render_as_string(hide_password=True)


def unreachable_service(exc: BaseException) -> str | None:
    """The message for `exc` when it is the database or the broker not answering."""
    settings = get_settings()
    if _database_lost(exc):
        return _cannot_reach("the database", settings.effective_database_url(), exc)
    if _broker_lost(exc):
        return _cannot_reach("the broker", settings.broker_url or "", exc)
    return None


def _cannot_reach(service: str, url: str, exc: BaseException) -> str:
    from agenttest_worker.errors import redact
    from agenttest_worker.store import error_reason  # see above

    # The driver may quote the address it was given: any URL in its words is redacted.
    return f"cannot reach {service} at {safe_url(url)}: {redact(error_reason(exc))}"


def _broker_lost(exc: BaseException) -> bool:
    """Whether `exc` is the broker out of reach: kombu's error (Celery publishing)."""
    kombu_exc = sys.modules.get("kombu.exceptions")
    return kombu_exc is not None and isinstance(exc, kombu_exc.OperationalError)


def _database_lost(exc: BaseException) -> bool:
    """Whether `exc` is the database out of reach (SQLAlchemy's error)."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_exc is None or not isinstance(exc, sqlalchemy_exc.DBAPIError):
        return False
    from agenttest_worker.store import is_connection_lost  # see above

    return is_connection_lost(exc)
