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
- learned concurrency (an agent with no `rate_limit`): AIMD on the calls in flight.
  Until the agent first answers 429 (or says a limit is spent), calls are not limited
  here at all. The first 429 sets the limit to half the calls to the agent then in
  flight, each later 429 halves it, but only once per window: a 429 to a call sent
  before the last halving does not halve again. A window's worth of successes (as many
  as the limit) while the window was full adds one. Never below 1. On a fleet the
  limit lives in Redis beside the other limits of the agent, and a process starts
  taking its slots once it has itself seen a 429 or a pause (before that it costs no
  Redis call).
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
from agenttest_worker.agents.waiting import Waits
from agenttest_worker.observe import metrics
from agenttest_worker.settings import get_settings, redis_py_url

log = logging.getLogger("agenttest.ratelimit")

PAUSE_AFTER_429 = 5.0
LEASE_MARGIN = 30.0
OUTAGE_GRACE = 60.0
PROBE_WAIT = 0.05
# A learned limit not touched for this long is forgotten: the next run starts afresh.
LEARNED_TTL = 3600
# Windows are kept this much longer than nominal, so that network jitter between the
# limiter's clock and the agent's arrival times cannot squeeze one call too many into
# what the agent sees as one window.
WINDOW_SLACK = 0.01

# KEYS: requests zset, tokens zset, concurrency zset, pause key, probe key, learned hash
# ARGV: now, request_limit, request_window, token_limit, token_window, concurrency_limit,
#       lease_id, lease_expiry, probe_wait, adaptive (1: the learned limit applies)
# Returns {0, wait_seconds}, {1, '0', epoch} or {1, 'probe', epoch} (this call goes first
# after a pause); epoch: the learned limit's halvings so far.
_ACQUIRE = """
local now = tonumber(ARGV[1])
local adaptive = ARGV[10] == '1'
local epoch = 0
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
if adaptive then
  local learned = redis.call('HMGET', KEYS[6], 'limit', 'epoch')
  conc_limit = tonumber(learned[1] or '0')
  epoch = tonumber(learned[2] or '0')
end
if conc_limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc_limit then
    wait = math.max(wait, 0.02)
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
if conc_limit > 0 or adaptive then
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[7])
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[8]) - now) + 5)
end
if probing then return {1, 'probe', epoch} end
return {1, '0', epoch}
"""

# The probe's answer was not a 429: let everyone through again (only if this lease is
# still the probe). KEYS: probe key; ARGV: lease_id.
_CLEAR_PROBE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


# What a call's answer does to the learned limit. KEYS: learned hash, concurrency zset.
# ARGV: outcome ('429' or 'ok'), the lease's epoch (-1: a call made before this process
# took slots, which may set a first limit but never halve one), the calls this process
# had in flight, now, the key's time to live, the provider's request limit (0: unknown).
# Returns the limit (0: none learned).
_ADAPT = """
local learned = redis.call('HMGET', KEYS[1], 'limit', 'epoch')
local limit = tonumber(learned[1] or '0')
local epoch = tonumber(learned[2] or '0')
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
local active = redis.call('ZCARD', KEYS[2])
local cap = tonumber(ARGV[6])
if ARGV[1] == '429' then
  local lease_epoch = tonumber(ARGV[2])
  if lease_epoch < 0 and limit > 0 then return limit end
  if lease_epoch >= 0 and lease_epoch ~= epoch then return limit end
  local base = limit
  if base == 0 then base = math.max(active, tonumber(ARGV[3])) end
  limit = math.max(1, math.floor(base / 2))
  if cap > 0 then limit = math.min(limit, cap) end
  redis.call('HSET', KEYS[1], 'limit', limit, 'epoch', epoch + 1, 'successes', 0)
elseif limit > 0 then
  local successes = redis.call('HINCRBY', KEYS[1], 'successes', 1)
  if successes >= limit then
    if active >= limit and (cap == 0 or limit < cap) then
      limit = limit + 1
      redis.call('HSET', KEYS[1], 'limit', limit)
    end
    redis.call('HSET', KEYS[1], 'successes', 0)
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return limit
"""


@dataclass(frozen=True)
class Limits:
    requests: int = 0
    request_window: float = 60.0
    tokens: int = 0
    token_window: float = 60.0
    concurrency: int = 0
    # No `rate_limit` configured: the calls in flight are limited by what the agent's
    # 429s teach (LEARNED), not by a number in agenttest.yaml.
    adaptive: bool = False

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

    @classmethod
    def for_agent(cls, limit: RateLimit | None) -> Limits:
        """The configured limits, or the learned ones when none are configured."""
        return cls.from_config(limit) or LEARNED


LEARNED = Limits(adaptive=True)


class Lease(Protocol):
    async def release(self, tokens: int, status: int | None = None) -> None: ...


class Limiter(Protocol):
    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease: ...

    async def pause(self, agent: str, seconds: float, probe: bool = True) -> None: ...

    def calls_ahead(self, agent: str) -> int:
        """Calls to `agent` that may be on their way besides the caller's own: what the
        provider's count of requests remaining may not have seen yet."""
        ...

    def provider_allows(self, agent: str, requests: int) -> None:
        """The provider says its request limit allows at most `requests` at once (a
        learned limit grows no further: more calls at once would be refused anyway)."""
        ...

    async def add_tokens(self, agent: str, limits: Limits, tokens: int) -> None: ...


class _Line:
    """The calls of one process waiting for an agent's slot: one at a time asks (the
    others wait their turn, in order, without polling), and a slot freed in this process
    wakes it at once."""

    __slots__ = ("lock", "wake")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.wake = asyncio.Event()


def _learned(agent: str, limit: int, before: int) -> None:
    """The learned limit of `agent` is now `limit` (was `before`; 0: none)."""
    metrics.learned_concurrency(agent, limit)
    if before == 0 or limit < before:  # (each step up is not worth a line)
        log.info("rate limit: %s answered 429; calls in flight now at most %d", agent, limit)


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
        self.line = _Line()
        # The learned limit (adaptive limits only): 0 until the first 429; its halvings
        # so far; the successes counted towards the next step up.
        self.learned = 0
        self.epoch = 0
        self.successes = 0
        self.cap = 0  # the provider's request limit, when it states one

    def answered(self, agent: str, epoch: int, status: int | None) -> None:
        """AIMD on a learned limit, from one answer (`active` still counts its call)."""
        if status == 429:
            if epoch != self.epoch:
                return  # sent before the last halving: that window has halved already
            before = self.learned
            self.learned = max(1, (self.learned or self.active) // 2)
            if self.cap:
                self.learned = min(self.learned, self.cap)
            self.epoch += 1
            self.successes = 0
            _learned(agent, self.learned, before)
        elif self.learned and status is not None and 200 <= status < 300:
            self.successes += 1
            if self.successes >= self.learned:
                self.successes = 0
                room = not self.cap or self.learned < self.cap
                if room and self.active >= self.learned:  # the window was in use: one more
                    self.learned += 1
                    metrics.learned_concurrency(agent, self.learned)


class _LocalLease:
    def __init__(
        self,
        state: _LocalState,
        counted: bool,
        start: list[float] | None,
        agent: str = "",
        adaptive: bool = False,
    ) -> None:
        self.state = state
        self.counted = counted
        self.start = start
        self.agent = agent
        self.adaptive = adaptive
        self.epoch = state.epoch

    async def release(self, tokens: int, status: int | None = None) -> None:
        state = self.state
        if state.probe is self and status != 429:
            state.probe = None
        if self.adaptive:
            state.answered(self.agent, self.epoch, status)
        if self.start is not None:
            self.start[0] = time.monotonic()
        if self.counted:
            state.active -= 1
            state.line.wake.set()
        if tokens:
            state.tokens.append((time.monotonic(), tokens))


class LocalLimiter:
    """The same rules for one process (one event loop)."""

    def __init__(self) -> None:
        self._states: dict[str, _LocalState] = {}

    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease:
        state = self._states.get(agent)
        if state is None:
            state = self._states[agent] = _LocalState()
        quiet = not state.learned and state.probe is None
        if limits.adaptive and quiet and state.paused_until <= time.monotonic():
            # Nothing learned yet and no pause: no wait, only counted.
            state.active += 1
            return _LocalLease(state, True, None, agent, True)
        waits = Waits()
        started = time.monotonic()
        try:
            lease = self._admit(state, limits, agent)
            if isinstance(lease, float):
                # One waiter at a time asks; the rest wait their turn in line.
                async with state.line.lock:
                    while isinstance(lease := self._admit(state, limits, agent), float):
                        await waits.sleep(lease, state.line.wake)
            return lease
        finally:
            waits.done()
            metrics.rate_limit_waited(agent, time.monotonic() - started)

    def _admit(self, state: _LocalState, limits: Limits, agent: str) -> Lease | float:
        """A lease, or the seconds to wait before asking again."""
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
        concurrency = state.learned if limits.adaptive else limits.concurrency
        if concurrency and state.active >= concurrency:
            wait = max(wait, 0.05)  # (or sooner: a call ending here wakes the line)
        if wait > 0:
            return wait
        start = [now] if limits.requests else None
        if start is not None:
            state.starts.append(start)
        counted = bool(limits.concurrency) or limits.adaptive
        if counted:
            state.active += 1
        lease = _LocalLease(state, counted, start, agent, limits.adaptive)
        if state.probe == "open":
            state.probe = lease
        return lease

    async def pause(self, agent: str, seconds: float, probe: bool = True) -> None:
        """Every call waits `seconds`; then, with `probe` (after a 429: the agent may still
        be overloaded), one call goes first and the others wait for its answer."""
        state = self._states.setdefault(agent, _LocalState())
        state.paused_until = max(state.paused_until, time.monotonic() + seconds)
        if probe:
            state.probe = "open"

    def calls_ahead(self, agent: str) -> int:
        state = self._states.get(agent)
        return max(0, state.active - 1) if state is not None else 0

    def provider_allows(self, agent: str, requests: int) -> None:
        self._states.setdefault(agent, _LocalState()).cap = requests

    async def add_tokens(self, agent: str, limits: Limits, tokens: int) -> None:
        if tokens and limits.tokens:
            self._states.setdefault(agent, _LocalState()).tokens.append((time.monotonic(), tokens))

    def learned(self, agent: str) -> int:
        """The limit learned for `agent` (0: none)."""
        state = self._states.get(agent)
        return state.learned if state is not None else 0


# -- across the fleet (Redis) -------------------------------------------------------------


class _NoLease:
    """What a call gets while Redis is unreachable past the grace period."""

    async def release(self, tokens: int, status: int | None = None) -> None:
        return None


class _LooseLease:
    """A call to an adaptive agent from a process that has seen no 429 from it: not in
    Redis, only counted here (what its first 429 halves, if it is the first)."""

    __slots__ = ("agent", "limiter")

    def __init__(self, limiter: RedisLimiter, agent: str) -> None:
        self.limiter = limiter
        self.agent = agent
        limiter.loose[agent] = limiter.loose.get(agent, 0) + 1

    async def release(self, tokens: int, status: int | None = None) -> None:
        limiter = self.limiter
        try:
            if status == 429:
                limiter.engaged.add(self.agent)
                await limiter.answered(self.agent, -1, status)
        finally:
            limiter.loose[self.agent] -= 1


class _RedisLease:
    def __init__(
        self,
        limiter: RedisLimiter,
        agent: str,
        lease_id: str,
        limits: Limits,
        probe: bool,
        epoch: int = 0,
    ) -> None:
        self.limiter = limiter
        self.agent = agent
        self.lease_id = lease_id
        self.limits = limits
        self.probe = probe
        self.epoch = epoch
        limiter.held[agent] = limiter.held.get(agent, 0) + 1

    async def release(self, tokens: int, status: int | None = None) -> None:
        try:
            await self._release(tokens, status)
        except self.limiter.outage:
            # Best effort: a lease left behind expires, a window entry ages out.
            log.warning(
                "rate limit: could not release a slot of %s (Redis unreachable)", self.agent
            )
        finally:
            self.limiter.held[self.agent] -= 1
            line = self.limiter.lines.get(self.agent)
            if line is not None:
                line.wake.set()

    async def _release(self, tokens: int, status: int | None) -> None:
        client = self.limiter.client
        keys = self.limiter.keys(self.agent)
        if self.probe and status != 429:
            await self.limiter._clear_probe(keys=[keys[4]], args=[self.lease_id])
        if self.limits.adaptive:
            await self.limiter.answered(self.agent, self.epoch, status)
        now = await self.limiter.now()
        pipe = client.pipeline(transaction=False)
        if self.limits.requests:
            pipe.zadd(keys[0], {self.lease_id: now}, xx=True)
        if self.limits.concurrency or self.limits.adaptive:
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
        # Imported when a shared limiter is made (redis.asyncio is ~0.13 s of start-up):
        # an embedded run never needs it.
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
        self._adapt: Any = self.client.register_script(_ADAPT)
        # Adaptive agents whose slots this process takes (it has seen a 429 or a pause);
        # the calls to the others it has in flight, taking none.
        self.engaged: set[str] = set()
        self.loose: dict[str, int] = {}
        self.held: dict[str, int] = {}  # the slots this process holds, by agent
        self.caps: dict[str, int] = {}  # the providers' request limits, when stated
        self.lines: dict[str, _Line] = {}
        self._learned: dict[str, int] = {}

    def keys(self, agent: str) -> list[str]:
        base = f"{self.prefix}:{agent}"
        return [
            f"{base}:requests",
            f"{base}:tokens",
            f"{base}:active",
            f"{base}:pause",
            f"{base}:probe",
            f"{base}:learned",
        ]

    async def now(self) -> float:
        # Redis's clock, not ours: every worker must agree on what "the last second" is.
        seconds, micros = await self.client.time()
        return float(seconds) + float(micros) / 1_000_000

    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease:
        if limits.adaptive and agent not in self.engaged:
            return _LooseLease(self, agent)
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
        line: _Line | None = None
        try:
            while True:
                try:
                    now = await self.now()
                    admitted = await self._script(
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
                            1 if limits.adaptive else 0,
                        ],
                    )
                except self.outage:
                    # The broker is restarting: wait for it, but never fail a turn over it.
                    outage_since = outage_since or time.monotonic()
                    if time.monotonic() - outage_since > self.outage_grace:
                        log.warning(
                            "rate limit: Redis unreachable; calling %s without limits", agent
                        )
                        return _NoLease()
                    await waits.sleep(1.0)
                    continue
                ok, wait = admitted[0], admitted[1]
                if int(ok) == 1:
                    probe = wait in (b"probe", "probe")
                    return _RedisLease(self, agent, lease_id, limits, probe, int(admitted[2]))
                if line is None:
                    # One waiter of this process at a time asks Redis; the rest wait their
                    # turn here, in order, instead of each polling it.
                    line = self.lines.setdefault(agent, _Line())
                    await line.lock.acquire()
                    continue  # (a slot may have freed while this call waited its turn)
                await waits.sleep(max(float(wait), 0.005), line.wake)
        finally:
            if line is not None:
                line.lock.release()

    async def answered(self, agent: str, epoch: int, status: int | None) -> None:
        """AIMD on the agent's learned limit (_ADAPT), from one answer."""
        if status == 429:
            outcome = "429"
        elif status is not None and 200 <= status < 300:
            outcome = "ok"
        else:
            return
        try:
            now = await self.now()
            limit = int(
                await self._adapt(
                    keys=[self.keys(agent)[5], self.keys(agent)[2]],
                    args=[
                        outcome,
                        epoch,
                        self.loose.get(agent, 0),
                        repr(now),
                        LEARNED_TTL,
                        self.caps.get(agent, 0),
                    ],
                )
            )
        except self.outage:
            log.warning("rate limit: could not adapt the limit of %s (Redis unreachable)", agent)
            return
        before = self._learned.get(agent, 0)
        if limit != before:
            self._learned[agent] = limit
            _learned(agent, limit, before)

    async def learned(self, agent: str) -> int:
        """The limit learned for `agent` across the fleet (0: none)."""
        value = await self.client.hget(self.keys(agent)[5], "limit")
        return int(value) if value is not None else 0

    def calls_ahead(self, agent: str) -> int:
        # This process's calls, or the fleet's as many as the learned limit lets through.
        mine = self.loose.get(agent, 0) + self.held.get(agent, 0)
        return max(0, mine - 1, self._learned.get(agent, 0) - 1)

    def provider_allows(self, agent: str, requests: int) -> None:
        self.caps[agent] = requests

    async def pause(self, agent: str, seconds: float, probe: bool = True) -> None:
        self.engaged.add(agent)
        try:
            now = await self.now()
            keys = self.keys(agent)
            until = now + seconds
            # Never shorten a pause another worker set.
            current = await self.client.get(keys[3])
            if current is None or float(current) < until:
                await self.client.set(keys[3], repr(until), ex=int(seconds) + 5)
            if probe:  # when it ends, one call goes first
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
