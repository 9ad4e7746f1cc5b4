"""Saying plainly that the database or the broker is out of reach.

A submission that cannot reach AGENTTEST_DATABASE_URL or AGENTTEST_BROKER_URL is not a
bug in agenttest; it must say which service, at which address (password hidden), and
what the driver said, in one line instead of an "internal error" with the driver's
exception class. Exit code 3 either way: nothing about the cases was wrong.

Only the modules a run has already imported are consulted (SQLAlchemy, kombu), so this
costs the command's start-up nothing.
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit, urlunsplit

from agenttest_worker.settings import get_settings


def _hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unreachable_service(exc: BaseException) -> str | None:
    """The message for `exc` when it is the database or the broker not answering."""
    settings = get_settings()
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_exc is not None and isinstance(exc, sqlalchemy_exc.DBAPIError):
        from agenttest_worker.store.db import is_connection_lost

        if is_connection_lost(exc):
            where = _hide_password(settings.effective_database_url())
            return f"cannot reach the database at {where}: {_first_line(exc)}"
    kombu_exc = sys.modules.get("kombu.exceptions")
    if kombu_exc is not None and isinstance(exc, kombu_exc.OperationalError):
        where = _hide_password(settings.broker_url or "")
        return f"cannot reach the broker at {where}: {_first_line(exc)}"
    return None
