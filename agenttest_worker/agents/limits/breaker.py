"""Failing fast on an agent that cannot be reached: a circuit breaker per agent.

Each call retries connection errors on its own (agents/limits/retry.py), so against an agent
that is down every case spent its whole retry schedule before failing, one after the
other. After AGENTTEST_BREAKER_FAILURES calls in a row (default 3) ended unable to
connect, each after its retries (a blip that a retry rides out counts for nothing), the
breaker opens: the agent's other calls fail at once, "agent X unreachable since <time>"
(the first failure of the streak), calls in the middle of their retries included.
Every PROBE_AFTER seconds one call goes through (a probe) while the others keep failing
fast; any answer from the agent, an HTTP error too, closes the breaker, and a probe that
cannot connect keeps it open.

Only failures to connect count (refused, unreachable, DNS, TLS handshake): a timeout or
a 5xx says the agent is there, slow or broken, which is the retries' business.

With a Redis broker the breaker is the fleet's (on the rate limiter's Redis client and
its outage handling, agents/limits/ratelimit.py): a worker that never called the agent fails
fast too. Each event loop reads the shared state at most every REFRESH seconds, so a
call to a healthy agent costs no Redis round trip; the price is that a worker may see
the breaker open (or a success elsewhere end a streak) up to that much late. Redis
unreachable: calls go ahead as if the breaker were closed. Without a broker (the
embedded default) the same rules hold in process, for the run.

A breaker is keyed by the agent's name and host:port, not its URL, whose userinfo or
query may hold a secret; its message names the agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import urlsplit

from agenttest_worker.agents.limits.ratelimit import RedisLimiter, limiter
from agenttest_worker.observe import metrics
from agenttest_worker.settings import get_settings

log = logging.getLogger("agenttest.breaker")

PROBE_AFTER = 5.0  # seconds an open breaker waits before one call tries the agent again
REFRESH = 1.0  # seconds an event loop trusts what it last read of a shared breaker
KEEP = 3600  # seconds a shared streak outlives its last failure (then it starts over)

# KEYS: the breaker's hash. ARGV: probe_after. Returns {} (no streak) or {count, since,
# reason, open_for, probe}: open_for -1 while closed; probe 1 when this caller probes.
_READ = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'count', 'since', 'reason', 'open_until')
if not s[1] then return {} end
local open_until = tonumber(s[4] or '0')
if open_until == 0 then return {s[1], s[2], s[3], '-1', 0} end
if open_until > now then return {s[1], s[2], s[3], tostring(open_until - now), 0} end
redis.call('HSET', KEYS[1], 'open_until', tostring(now + tonumber(ARGV[1])))
return {s[1], s[2], s[3], ARGV[1], 1}
"""

# KEYS: the breaker's hash. ARGV: failures, probe_after, reason, keep. Returns as _READ.
_FAILED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
if count == 1 then redis.call('HSET', KEYS[1], 'since', tostring(now)) end
redis.call('HSET', KEYS[1], 'reason', ARGV[3])
if count >= tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'open_until', tostring(now + tonumber(ARGV[2])))
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
local open_for = '-1'
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
if open_until > 0 then open_for = tostring(math.max(open_until - now, 0)) end
return {tostring(count), redis.call('HGET', KEYS[1], 'since'), ARGV[3], open_for, 0}
"""


@dataclass(frozen=True)
class Tripped:
    """An open breaker, as a call that is not made reports it."""

    since: float  # the first failure of the streak (seconds since the epoch)
    reason: str  # what the last call that could not connect ran into

    def message(self, agent: str) -> str:
        when = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"agent error: agent {agent} unreachable since {when} (last: {self.reason})"


@dataclass
class _Streak:
    count: int
    since: float
    reason: str
    open_until: float  # time.monotonic(); 0 while closed


class Breaker(Protocol):
    async def admit(self, key: str) -> Tripped | None:
        """None: make the call (or the attempt); else fail it at once with this."""
        ...

    async def failed(self, key: str, reason: str) -> None:
        """A call ended unable to connect (after its retries)."""
        ...

    async def reached(self, key: str) -> None:
        """The agent answered (any HTTP status)."""
        ...


@lru_cache(maxsize=1024)
def endpoint_key(agent: str, url: str) -> str:
    """The breaker's name for `agent` at `url`: name and host:port, nothing secret."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = 443 if parts.scheme == "https" else 80
    return f"{agent}@{parts.hostname or ''}:{port or default}"


def unreachable_reason(exc: Any) -> str:
    """An aiohttp ClientConnectorError in words, without aiohttp's noise: "Cannot connect
    to host 127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]" reads
    "cannot connect to 127.0.0.1:9: Connection refused"."""
    os_error: OSError = exc.os_error
    errno = os_error.errno
    certificate = getattr(exc, "certificate_error", None)
    if certificate is not None:
        detail = str(certificate)
    elif isinstance(errno, int) and errno > 0 and not isinstance(os_error, socket.gaierror):
        detail = os.strerror(errno)  # "Connection refused", not "Connect call failed (...)"
    else:
        detail = os_error.strerror or str(os_error) or type(os_error).__name__
    return f"cannot connect to {exc.host}:{exc.port}: {detail}"


class LocalBreaker:
    """The breaker's rules for one process (one event loop)."""

    def __init__(self, failures: int, probe_after: float = PROBE_AFTER) -> None:
        self.failures = failures
        self.probe_after = probe_after
        self._streaks: dict[str, _Streak] = {}

    async def admit(self, key: str) -> Tripped | None:
        streak = self._streaks.get(key)
        if streak is None or not streak.open_until:
            return None
        now = time.monotonic()
        if now >= streak.open_until:
            streak.open_until = now + self.probe_after  # this call probes; the rest wait
            return None
        metrics.breaker_seen(key, True)
        return Tripped(streak.since, streak.reason)

    async def failed(self, key: str, reason: str) -> None:
        if not self.failures:
            return
        streak = self._streaks.setdefault(key, _Streak(0, time.time(), reason, 0.0))
        streak.count += 1
        streak.reason = reason
        if streak.count >= self.failures:
            streak.open_until = time.monotonic() + self.probe_after

    async def reached(self, key: str) -> None:
        if self._streaks.pop(key, None) is not None:
            metrics.breaker_seen(key, False)


class RedisBreaker:
    """The breaker's rules for every process on the same Redis (the broker)."""

    def __init__(
        self,
        client: Any,
        outage: tuple[type[BaseException], ...],
        failures: int,
        probe_after: float = PROBE_AFTER,
        refresh: float = REFRESH,
        prefix: str = "agenttest:breaker",
    ) -> None:
        self.client = client
        self.outage = outage
        self.failures = failures
        self.probe_after = probe_after
        self.refresh = refresh
        self.prefix = prefix
        self._read: Any = client.register_script(_READ)
        self._failed: Any = client.register_script(_FAILED)
        # What this loop last read of each breaker: (when, the streak or None).
        self._known: dict[str, tuple[float, _Streak | None]] = {}
        # The breakers being read again now. The calls that find what this loop knows
        # out of date while it is read go on what it knew (at most a round trip older):
        # else each of the hundreds of turns in flight that call the agent in that
        # round trip reads it too, each on a connection of its own.
        self._refreshing: set[str] = set()

    async def admit(self, key: str) -> Tripped | None:
        now = time.monotonic()
        read_at, streak = self._known.get(key, (-self.refresh, None))
        probe_due = streak is not None and 0 < streak.open_until <= now
        stale = now - read_at >= self.refresh and key not in self._refreshing
        if stale or probe_due:  # a due probe is Redis's to give to one call: always asked
            self._refreshing.add(key)
            try:
                found = await self._read(keys=[f"{self.prefix}:{key}"], args=[self.probe_after])
            except self.outage:
                log.warning("breaker: Redis unreachable; calling %s regardless", key)
                self._known[key] = (now, None)
                return None
            finally:
                self._refreshing.discard(key)
            streak, probe = _decode(found, now)
            self._known[key] = (now, streak)
            if probe:
                return None
        if streak is not None and now < streak.open_until:
            metrics.breaker_seen(key, True)
            return Tripped(streak.since, streak.reason)
        return None

    async def failed(self, key: str, reason: str) -> None:
        if not self.failures:
            return
        try:
            found = await self._failed(
                keys=[f"{self.prefix}:{key}"], args=[self.failures, self.probe_after, reason, KEEP]
            )
        except self.outage:
            log.warning("breaker: could not count a failure of %s (Redis unreachable)", key)
            return
        now = time.monotonic()
        self._known[key] = (now, _decode(found, now)[0])

    async def reached(self, key: str) -> None:
        _, streak = self._known.get(key, (0.0, None))
        if streak is None:
            return  # no streak to end, as far as this loop knows (see REFRESH)
        self._known[key] = (time.monotonic(), None)
        metrics.breaker_seen(key, False)
        try:
            await self.client.delete(f"{self.prefix}:{key}")
        except self.outage:
            log.warning("breaker: could not close the breaker of %s (Redis unreachable)", key)


def _decode(found: list[Any], now: float) -> tuple[_Streak | None, bool]:
    """A script's answer: the streak (None when there is none) and whether to probe."""
    if not found:
        return None, False
    count, since, reason, open_for, probe = found
    text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    seconds = float(open_for)
    streak = _Streak(int(count), float(since), text, now + seconds if seconds >= 0 else 0.0)
    return streak, int(probe) == 1


_breakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Breaker] = (
    weakref.WeakKeyDictionary()
)


def breaker() -> Breaker:
    """The running loop's breaker: the fleet's through the Redis broker when there is one."""
    loop = asyncio.get_running_loop()
    current = _breakers.get(loop)
    if current is None:
        failures = get_settings().breaker_failures
        shared = limiter() if failures else None
        if isinstance(shared, RedisLimiter):
            current = RedisBreaker(shared.client, shared.outage, failures)
        else:
            current = LocalBreaker(failures)
        _breakers[loop] = current
    return current
