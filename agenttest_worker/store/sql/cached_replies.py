"""The reply cache in the database (agents/reply_cache.py has the design): SQLite
embedded, Postgres on a fleet, where every worker shares it.

A row without `lease_until` is a cached reply until `expires_at`; a row with one is a
lease: the caller that inserted it is calling the agent until then. (`lease_until`
tells them apart, not a NULL reply: the JSON column stores None as JSON null.) Time is the
database's clock where it has one (shared.ago), so workers agree on what expired.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from agenttest_worker.agents.reply_cache import Busy, CacheEntry, Claim, Hit, Leased
from agenttest_worker.results import AgentRole
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql.db import session_scope, upgrade
from agenttest_worker.store.sql.models import ReplyCacheRow
from agenttest_worker.store.sql.shared import ago, insert_ignoring, inserted, now

_IS_LEASE = ReplyCacheRow.lease_until.is_not(None)
_IS_REPLY = ReplyCacheRow.lease_until.is_(None)


@dataclass(frozen=True)
class CacheLimits:
    """How long a reply is kept, how many are kept (the oldest evicted past it), and how
    long a caller's lease holds the others back."""

    ttl_seconds: float = 14 * 86400
    max_entries: int = 100_000
    lease_seconds: float = 120.0
    # Replies stored between two evictions: an eviction reads past `max_entries` rows of
    # the index, so it runs on a process's first store and then once in this many.
    evict_every: int = 64


@dataclass(frozen=True)
class AgentCacheStats:
    agent: str
    entries: int
    size_bytes: int
    oldest: datetime | None
    newest: datetime | None


class SqlReplyCache:
    """The `ReplyCacheStore` of a database at `url`."""

    def __init__(self, url: str, limits: CacheLimits | None = None) -> None:
        self.url = url
        self.limits = limits or CacheLimits()
        self._fills = itertools.count()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        upgrade(self.url)  # a no-op once this process brought the schema up to date
        with session_scope(self.url) as session:
            yield session

    def lease_seconds(self) -> float:
        return self.limits.lease_seconds

    def claim(self, key: str, agent: str, role: AgentRole) -> Claim:
        # Three rounds at most: a row that vanishes (evicted, released) between the insert
        # that found it and the read is claimed again.
        for _ in range(3):
            with self._session() as session:
                found = session.execute(
                    select(
                        ReplyCacheRow.reply,
                        ReplyCacheRow.lease_until.is_not(None),
                        ReplyCacheRow.expires_at > now(session),
                        ReplyCacheRow.lease_until > now(session),
                    ).where(ReplyCacheRow.key == key)
                ).first()
                if found is None:
                    row = self._lease_row(key, agent, role)
                    if inserted(session, ReplyCacheRow, row):
                        return Leased()
                    continue
                reply, is_lease, fresh, leased = found
                if not is_lease and fresh:
                    return Hit(reply if isinstance(reply, dict) else json.loads(reply))
                if is_lease and leased:
                    return Busy()
                # Expired, or a lease given up on: taken over by whoever updates it first.
                at = now(session)
                stale = or_(
                    and_(_IS_REPLY, ReplyCacheRow.expires_at <= at),
                    and_(_IS_LEASE, ReplyCacheRow.lease_until <= at),
                )
                changed = session.execute(
                    update(ReplyCacheRow)
                    .where(ReplyCacheRow.key == key, stale)
                    .values(reply=None, lease_until=ago(session, -self.limits.lease_seconds))
                    .execution_options(synchronize_session=False)
                )
                if _rowcount(changed) == 1:
                    return Leased()
        return Busy()

    def _lease_row(self, key: str, agent: str, role: AgentRole) -> dict[str, Any]:
        # This process's clock: the insert helper takes values, not SQL expressions.
        at = _utc_now()
        return {
            "key": key,
            "agent": agent,
            "role": role,
            "reply": None,
            "size_bytes": 0,
            "created_at": at,
            "expires_at": at,
            "lease_until": at + timedelta(seconds=self.limits.lease_seconds),
        }

    def fill(self, entry: CacheEntry) -> None:
        text = json.dumps(entry.reply, default=str)
        with self._session() as session:
            row = {
                "key": entry.key,
                "agent": entry.agent,
                "role": entry.role,
                "reply": None,
                "size_bytes": 0,
                "created_at": _utc_now(),
                "expires_at": _utc_now(),
                "lease_until": None,
            }
            insert_ignoring(session, ReplyCacheRow, [row])
            session.execute(
                update(ReplyCacheRow)
                .where(ReplyCacheRow.key == entry.key)
                .values(
                    agent=entry.agent,
                    role=entry.role,
                    reply=entry.reply,
                    size_bytes=len(text.encode()),
                    created_at=now(session),
                    expires_at=ago(session, -self.limits.ttl_seconds),
                    lease_until=None,
                )
                .execution_options(synchronize_session=False)
            )
        if next(self._fills) % self.limits.evict_every == 0:
            self._evict()

    def release(self, key: str) -> None:
        """Give up a lease (the call failed): the next caller calls for itself."""
        with self._session() as session:
            session.execute(
                delete(ReplyCacheRow)
                .where(ReplyCacheRow.key == key, _IS_LEASE)
                .execution_options(synchronize_session=False)
            )

    def _evict(self) -> None:
        """Expired replies out, then the oldest past `max_entries`."""
        with self._session() as session:
            session.execute(
                delete(ReplyCacheRow)
                .where(_IS_REPLY, ReplyCacheRow.expires_at <= now(session))
                .execution_options(synchronize_session=False)
            )
            cutoff = session.execute(
                select(ReplyCacheRow.created_at)
                .where(_IS_REPLY)
                .order_by(ReplyCacheRow.created_at.desc())
                .offset(self.limits.max_entries)
                .limit(1)
            ).scalar()
            if cutoff is not None:
                session.execute(
                    delete(ReplyCacheRow)
                    .where(ReplyCacheRow.created_at <= cutoff, _IS_REPLY)
                    .execution_options(synchronize_session=False)
                )

    # -- agenttest-submit cache stats|clear ------------------------------------------------

    def stats(self, agent: str | None = None) -> list[AgentCacheStats]:
        with self._session() as session:
            query = (
                select(
                    ReplyCacheRow.agent,
                    func.count(),
                    func.coalesce(func.sum(ReplyCacheRow.size_bytes), 0),
                    func.min(ReplyCacheRow.created_at),
                    func.max(ReplyCacheRow.created_at),
                )
                .where(_IS_REPLY)
                .group_by(ReplyCacheRow.agent)
                .order_by(ReplyCacheRow.agent)
            )
            if agent is not None:
                query = query.where(ReplyCacheRow.agent == agent)
            return [
                AgentCacheStats(str(a), int(n), int(size), oldest, newest)
                for a, n, size, oldest, newest in session.execute(query)
            ]

    def clear(self, agent: str | None = None, older_than: float | None = None) -> int:
        """Remove cached replies (of `agent`, stored more than `older_than` seconds ago);
        how many were removed."""
        with self._session() as session:
            statement = delete(ReplyCacheRow).execution_options(synchronize_session=False)
            if agent is not None:
                statement = statement.where(ReplyCacheRow.agent == agent)
            if older_than is not None:
                statement = statement.where(ReplyCacheRow.created_at <= ago(session, older_than))
            return _rowcount(session.execute(statement))


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def _utc_now() -> datetime:
    # Aware: Postgres stores the instant; SQLite's format drops the zone and keeps UTC,
    # as shared.ago compares there.
    return datetime.now(UTC)


def reply_cache_at(url: str) -> SqlReplyCache:
    """The reply cache of the database at `url`, bounded as the settings say."""
    settings = get_settings()
    limits = CacheLimits(
        ttl_seconds=settings.reply_cache_ttl,
        max_entries=settings.reply_cache_max_entries,
        lease_seconds=settings.reply_cache_lease,
    )
    return SqlReplyCache(url, limits)
