"""Fleet-wide rate limits per agent: requests per second/minute, tokens per minute,
concurrent calls, and backing off together after a 429.

With a Redis broker the limits hold across every worker process: each limit is a
small Lua script run atomically in Redis. Without one (the embedded default) the same
rules are kept in process. Waiting is `asyncio.sleep` until the slot the limiter
names, never a busy loop; a worker thread waiting on a slot is idle.

- requests: a sliding-window log (a sorted set with one entry per call): a call may
  start when fewer than the limit have entries in the last window. An entry is stamped
  when the call is admitted and stamped again when its response arrives, so the window
  is measured from the latest moment the agent can have seen the request: the agent
  never sees more than `requests_per_second` calls arrive in any second (or
  `requests_per_minute` in any minute), whatever the network delays.
- tokens: a sliding window of (time, tokens) entries recorded after each call; a call
  may start while the window's total is under the limit.
- concurrency: leases in a sorted set scored by expiry, so a worker that dies holding
  one frees it when the lease expires (its call's timeout plus a margin).
- 429: a `Retry-After` (or a default pause) sets a pause shared by every caller of the
  agent, so the whole fleet backs off together instead of each worker hammering it.
  When the pause ends, one call goes first (a probe); the others wait for its answer,
  so an agent still overloaded gets one request, not the whole backlog at once.
- Redis unreachable (the broker restarting): limiter calls wait for it, and after
  OUTAGE_GRACE seconds calls go ahead unlimited rather than failing their turns.
- Waiting is not being lost: a turn waiting for a slot, or out a 429's back-off, is
  listed as waiting while it waits (waiting.py), and a worker marks the turns listed
  there alive (fleet/liveness.py), so that neither the broker's visibility timeout nor
  the stall sweeper takes a waiting turn for a lost one and plays it a second time.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from agenttest_worker.agents.config import RateLimit
from agenttest_worker.agents.limits.waiting import Waits
from agenttest_worker.observe import metrics
from agenttest_worker.settings import get_settings, redis_py_url

log = logging.getLogger("agenttest.ratelimit")

PAUSE_AFTER_429 = 5.0
LEASE_MARGIN = 30.0
OUTAGE_GRACE = 60.0
PROBE_WAIT = 0.05
# Windows are kept this much longer than nominal, so that network jitter between the
# limiter's clock and the agent's arrival times cannot squeeze one call too many into
# what the agent sees as one window.
WINDOW_SLACK = 0.01

# KEYS: requests zset, tokens zset, concurrency zset, pause key, probe key
# ARGV: now, request_limit, request_window, token_limit, token_window, concurrency_limit,
#       lease_id, lease_expiry, probe_wait
# Returns {0, wait_seconds}, {1, 0} or {1, 'probe'} (this call goes first after a pause).
_ACQUIRE = """
local now = tonumber(ARGV[1])
local pause = tonumber(redis.call('GET', KEYS[4]) or '0')
if pause > now then return {0, tostring(pause - now)} end
local probe = redis.call('GET', KEYS[5])
local probing = false
if probe then
  if probe ~= 'open' then return {0, ARGV[9]} end
  probing = true
end
local wait = 0
local req_limit = tonumber(ARGV[2])
if req_limit > 0 then
  local window = tonumber(ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
  if redis.call('ZCARD', KEYS[1]) >= req_limit then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now)
  end
end
local tok_limit = tonumber(ARGV[4])
if tok_limit > 0 then
  local window = tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
  local used = 0
  local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    used = used + tonumber(string.match(entries[i], ':(%d+)$'))
  end
  if used >= tok_limit and #entries > 0 then
    wait = math.max(wait, tonumber(entries[2]) + window - now)
  end
end
local conc_limit = tonumber(ARGV[6])
if conc_limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc_limit then
    wait = math.max(wait, 0.05)
  end
end
if wait > 0 then return {0, tostring(wait)} end
if probing then
  redis.call('SET', KEYS[5], ARGV[7], 'PX', math.ceil((tonumber(ARGV[8]) - now) * 1000))
end
if req_limit > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[7])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 5)
end
if conc_limit > 0 then
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[7])
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[8]) - now) + 5)
end
if probing then return {1, 'probe'} end
return {1, '0'}
"""

# The probe's answer was not a 429: let everyone through again (only if this lease is
# still the probe). KEYS: probe key; ARGV: lease_id.
_CLEAR_PROBE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Limits:
    requests: int = 0
    request_window: float = 60.0
    tokens: int = 0
    token_window: float = 60.0
    concurrency: int = 0

    @classmethod
    def from_config(cls, limit: RateLimit | None) -> Limits | None:
        if limit is None:
            return None
        if limit.requests_per_second:
            requests, window = limit.requests_per_second, 1.0
        elif limit.requests_per_minute:
            requests, window = limit.requests_per_minute, 60.0
        else:
            requests, window = 0, 60.0
        return cls(
            requests=requests,
            request_window=window + WINDOW_SLACK,
            tokens=limit.tokens_per_minute or 0,
            concurrency=limit.concurrency or 0,
        )


class Lease(Protocol):
    async def release(self, tokens: int, status: int | None = None) -> None: ...


class Limiter(Protocol):
    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease: ...

    async def pause(self, agent: str, seconds: float) -> None: ...

    async def add_tokens(self, agent: str, limits: Limits, tokens: int) -> None: ...


# -- in process --------------------------------------------------------------------------


class _LocalState:
    def __init__(self) -> None:
        # After a pause: "open" until a probe goes, then the probe's lease until it answers.
        self.probe: object | None = None
        # One [stamp] cell per admitted call, restamped when its response arrives.
        self.starts: list[list[float]] = []
        self.tokens: deque[tuple[float, int]] = deque()
        self.active = 0
        self.paused_until = 0.0


class _LocalLease:
    def __init__(self, state: _LocalState, counted: bool, start: list[float] | None) -> None:
        self.state = state
        self.counted = counted
        self.start = start

    async def release(self, tokens: int, status: int | None = None) -> None:
        if self.state.probe is self and status != 429:
            self.state.probe = None
        if self.start is not None:
            self.start[0] = time.monotonic()
        if self.counted:
            self.state.active -= 1
        if tokens:
            self.state.tokens.append((time.monotonic(), tokens))


class LocalLimiter:
    """The same rules for one process (one event loop)."""

    def __init__(self) -> None:
        self._states: dict[str, _LocalState] = {}

    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease:
        state = self._states.setdefault(agent, _LocalState())
        waits = Waits()
        started = time.monotonic()
        try:
            return await self._acquire(state, limits, waits)
        finally:
            waits.done()
            metrics.rate_limit_waited(agent, time.monotonic() - started)

    async def _acquire(self, state: _LocalState, limits: Limits, waits: Waits) -> Lease:
        while True:
            now = time.monotonic()
            wait = max(0.0, state.paused_until - now)
            if wait == 0 and state.probe is not None and state.probe != "open":
                wait = PROBE_WAIT  # the probe after a pause has not answered yet
            if limits.requests:
                state.starts = [s for s in state.starts if s[0] > now - limits.request_window]
                if len(state.starts) >= limits.requests:
                    oldest = min(s[0] for s in state.starts)
                    wait = max(wait, oldest + limits.request_window - now)
            if limits.tokens:
                while state.tokens and state.tokens[0][0] <= now - limits.token_window:
                    state.tokens.popleft()
                if state.tokens and sum(t for _, t in state.tokens) >= limits.tokens:
                    wait = max(wait, state.tokens[0][0] + limits.token_window - now)
            if limits.concurrency and state.active >= limits.concurrency:
                wait = max(wait, 0.02)
            if wait <= 0:
                start = [now] if limits.requests else None
                if start is not None:
                    state.starts.append(start)
                if limits.concurrency:
                    state.active += 1
                lease = _LocalLease(state, bool(limits.concurrency), start)
                if state.probe == "open":
                    state.probe = lease
                return lease
            await waits.sleep(wait)

    async def pause(self, agent: str, seconds: float) -> None:
        state = self._states.setdefault(agent, _LocalState())
        state.paused_until = max(state.paused_until, time.monotonic() + seconds)
        state.probe = "open"

    async def add_tokens(self, agent: str, limits: Limits, tokens: int) -> None:
        if tokens and limits.tokens:
            self._states.setdefault(agent, _LocalState()).tokens.append((time.monotonic(), tokens))


# -- across the fleet (Redis) -------------------------------------------------------------


class _NoLease:
    """What a call gets while Redis is unreachable past the grace period."""

    async def release(self, tokens: int, status: int | None = None) -> None:
        return None


class _RedisLease:
    def __init__(
        self, limiter: RedisLimiter, agent: str, lease_id: str, limits: Limits, probe: bool
    ) -> None:
        self.limiter = limiter
        self.agent = agent
        self.lease_id = lease_id
        self.limits = limits
        self.probe = probe

    async def release(self, tokens: int, status: int | None = None) -> None:
        try:
            await self._release(tokens, status)
        except self.limiter.outage:
            # Best effort: a lease left behind expires, a window entry ages out.
            log.warning(
                "rate limit: could not release a slot of %s (Redis unreachable)", self.agent
            )

    async def _release(self, tokens: int, status: int | None) -> None:
        client = self.limiter.client
        keys = self.limiter.keys(self.agent)
        if self.probe and status != 429:
            await self.limiter._clear_probe(keys=[keys[4]], args=[self.lease_id])
        now = await self.limiter.now()
        pipe = client.pipeline(transaction=False)
        if self.limits.requests:
            pipe.zadd(keys[0], {self.lease_id: now}, xx=True)
        if self.limits.concurrency:
            pipe.zrem(keys[2], self.lease_id)
        if tokens and self.limits.tokens:
            pipe.zadd(keys[1], {f"{self.lease_id}:{tokens}": now})
            pipe.expire(keys[1], int(self.limits.token_window) + 5)
        if len(pipe):
            await pipe.execute()


class RedisLimiter:
    """Limits shared by every process that uses the same Redis (the broker)."""

    def __init__(
        self, url: str, prefix: str = "agenttest:ratelimit", outage_grace: float = OUTAGE_GRACE
    ) -> None:
        # Imported when a shared limiter is made: an embedded run never needs redis.asyncio.
        import redis.asyncio as aioredis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        # What a Redis outage looks like from redis-py (refused, reset, timed out).
        self.outage: tuple[type[BaseException], ...] = (
            OSError,
            RedisConnectionError,
            RedisTimeoutError,
        )
        self.client: Any = aioredis.Redis.from_url(redis_py_url(url))
        self.prefix = prefix
        self.outage_grace = outage_grace
        self._script: Any = self.client.register_script(_ACQUIRE)
        self._clear_probe: Any = self.client.register_script(_CLEAR_PROBE)

    def keys(self, agent: str) -> list[str]:
        base = f"{self.prefix}:{agent}"
        return [
            f"{base}:requests",
            f"{base}:tokens",
            f"{base}:active",
            f"{base}:pause",
            f"{base}:probe",
        ]

    async def now(self) -> float:
        # Redis's clock, not ours: every worker must agree on what "the last second" is.
        seconds, micros = await self.client.time()
        return float(seconds) + float(micros) / 1_000_000

    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease:
        waits = Waits()
        started = time.monotonic()
        try:
            return await self._acquire(agent, limits, lease_seconds, waits)
        finally:
            waits.done()
            metrics.rate_limit_waited(agent, time.monotonic() - started)

    async def _acquire(
        self, agent: str, limits: Limits, lease_seconds: float, waits: Waits
    ) -> Lease:
        lease_id = secrets.token_hex(8)
        outage_since: float | None = None
        while True:
            try:
                now = await self.now()
                ok, wait = await self._script(
                    keys=self.keys(agent),
                    args=[
                        repr(now),
                        limits.requests,
                        limits.request_window,
                        limits.tokens,
                        limits.token_window,
                        limits.concurrency,
                        lease_id,
                        repr(now + lease_seconds + LEASE_MARGIN),
                        repr(PROBE_WAIT),
                    ],
                )
            except self.outage:
                # The broker is restarting: wait for it, but never fail a turn over it.
                outage_since = outage_since or time.monotonic()
                if time.monotonic() - outage_since > self.outage_grace:
                    log.warning("rate limit: Redis unreachable; calling %s without limits", agent)
                    return _NoLease()
                await waits.sleep(1.0)
                continue
            if int(ok) == 1:
                probe = wait in (b"probe", "probe")
                return _RedisLease(self, agent, lease_id, limits, probe)
            await waits.sleep(max(float(wait), 0.005))

    async def pause(self, agent: str, seconds: float) -> None:
        try:
            now = await self.now()
            keys = self.keys(agent)
            until = now + seconds
            # Never shorten a pause another worker set.
            current = await self.client.get(keys[3])
            if current is None or float(current) < until:
                await self.client.set(keys[3], repr(until), ex=int(seconds) + 5)
            # When it ends, one call goes first.
            await self.client.set(keys[4], "open", ex=int(seconds + LEASE_MARGIN) + 5)
        except self.outage:
            log.warning("rate limit: could not share a pause for %s (Redis unreachable)", agent)

    async def add_tokens(self, agent: str, limits: Limits, tokens: int) -> None:
        if not (tokens and limits.tokens):
            return
        key = self.keys(agent)[1]
        try:
            now = await self.now()
            await self.client.zadd(key, {f"{secrets.token_hex(8)}:{tokens}": now})
            await self.client.expire(key, int(limits.token_window) + 5)
        except self.outage:
            log.warning("rate limit: could not count tokens of %s (Redis unreachable)", agent)


_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Limiter] = (
    weakref.WeakKeyDictionary()
)


def limiter() -> Limiter:
    """The running loop's limiter: shared through Redis when there is one (the broker, or
    AGENTTEST_REDIS_URL)."""
    loop = asyncio.get_running_loop()
    current = _limiters.get(loop)
    if current is None:
        shared = get_settings().shared_redis_url
        current = RedisLimiter(shared) if shared else LocalLimiter()
        _limiters[loop] = current
    return current
