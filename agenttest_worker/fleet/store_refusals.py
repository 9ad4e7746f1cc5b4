"""Saying where a waiting submitter reads it that the store refuses the fleet's writes.

A worker whose writes the database refuses for now (the disk full, statement timeouts:
store/sql/db.py `transient_refusal`) keeps its steps and tries them again
(`reconnecting`); meanwhile no conversation moves, and a submitter waiting for the run
would wait in silence. So each refusal is noted in the fleet's shared Redis (the
broker's, or AGENTTEST_REDIS_URL), for a little longer than the retries' longest pause,
and `agenttest-submit --wait` says it ("the store refuses writes: disk full (...)").
Without a shared Redis nothing is noted, and the submitter says nothing of it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from agenttest_worker.settings import get_settings, redis_py_url

log = logging.getLogger("agenttest.tasks")  # the name deployments filter on

KEY = "agenttest:store-refusing"
# Seconds a note lasts: longer than the longest pause between two retries (8 s), so that
# it stays while the refusals go on, and is gone soon after the store takes writes.
NOTE_SECONDS = 20
# A worker notes a refusal at most this often (each retry of each turn is one).
NOTE_EVERY = 2.0


class RefusalNotes:
    """A worker's notes of refused writes (a `db.on_refusal` listener), to `redis_url`."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self._lock = threading.Lock()
        self._last = 0.0
        self._client: Any = None

    def __call__(self, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < NOTE_EVERY:
                return
            self._last = now
        log.warning("the store refuses writes for now: %s; retrying", reason)
        try:
            self._redis().set(KEY, reason, ex=NOTE_SECONDS)
        except Exception as exc:  # Redis out of reach: the worker's log says it all the same
            log.debug("could not note the store's refusal in Redis: %s", exc)

    def _redis(self) -> Any:
        if self._client is None:
            import redis  # here: only a worker whose writes are refused needs it

            self._client = redis.Redis.from_url(
                redis_py_url(self.redis_url), socket_connect_timeout=2, socket_timeout=2
            )
        return self._client


def listen() -> None:
    """Note this process's refused writes, when the fleet shares a Redis."""
    from agenttest_worker.store.sql.db import on_refusal

    url = get_settings().shared_redis_url
    if url and not any(isinstance(known, RefusalNotes) for known in _listening):
        notes = RefusalNotes(url)
        _listening.append(notes)
        on_refusal(notes)


_listening: list[RefusalNotes] = []


def store_refusal() -> str | None:
    """Why the store refuses the fleet's writes, as a worker noted it lately, or None
    (none did, or the fleet shares no Redis)."""
    url = get_settings().shared_redis_url
    if not url:
        return None
    import redis  # here: only a waiting submitter asks

    client = redis.Redis.from_url(redis_py_url(url), socket_connect_timeout=2, socket_timeout=2)
    try:
        found = client.get(KEY)
    finally:
        client.close()
    if found is None:
        return None
    return found.decode() if isinstance(found, bytes) else str(found)
