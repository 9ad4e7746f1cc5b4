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
- learned concurrency (an agent with no `rate_limit`): AIMD on the calls in flight, unset
  until the first 429, halved once per window, one more after a window's worth of
  successes, never below 1; on a fleet kept in Redis beside the agent's other limits
  (docs/DESIGN.md has the choices).
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
from dataclasses import dataclass
from typing import Any, Protocol

from agenttest_worker.agents.config import RateLimit
from agenttest_worker.agents.limits.limit_scripts import ACQUIRE, ADAPT, CLEAR_PROBE
from agenttest_worker.agents.limits.local_limits import (
    Line,
    LocalLease,
    LocalState,
    learned_changed,
)
from agenttest_worker.agents.limits.waiting import Waits
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


# -- in process (its state per agent: local_limits.py) -------------------------------------


class LocalLimiter:
    """The same rules for one process (one event loop)."""

    def __init__(self) -> None:
        self._states: dict[str, LocalState] = {}

    async def acquire(self, agent: str, limits: Limits, lease_seconds: float) -> Lease:
        state = self._states.get(agent)
        if state is None:
            state = self._states[agent] = LocalState()
        quiet = not state.learned and state.probe is None
        if limits.adaptive and quiet and state.paused_until <= time.monotonic():
            # Nothing learned yet and no pause: no wait, only counted.
            state.active += 1
            return LocalLease(state, True, None, agent, True)
        waits = Waits()
        started = time.monotonic()
        try:
            lease = self._admit(state, limits, agent)
            if isinstance(lease, float):
                # One waiter at a time asks; the rest wait their turn in line.
                waits.begin()
                async with state.line.lock:
                    while isinstance(lease := self._admit(state, limits, agent), float):
                        await waits.sleep(lease, state.line.wake)
            return lease
        finally:
            waits.done()
            metrics.rate_limit_waited(agent, time.monotonic() - started)

    def _admit(self, state: LocalState, limits: Limits, agent: str) -> Lease | float:
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
        lease = LocalLease(state, counted, start, agent, limits.adaptive)
        if state.probe == "open":
            state.probe = lease
        return lease

    async def pause(self, agent: str, seconds: float, probe: bool = True) -> None:
        """Every call waits `seconds`; then, with `probe` (after a 429: the agent may still
        be overloaded), one call goes first and the others wait for its answer."""
        state = self._states.setdefault(agent, LocalState())
        state.paused_until = max(state.paused_until, time.monotonic() + seconds)
        if probe:
            state.probe = "open"

    def calls_ahead(self, agent: str) -> int:
        state = self._states.get(agent)
        return max(0, state.active - 1) if state is not None else 0

    def provider_allows(self, agent: str, requests: int) -> None:
        self._states.setdefault(agent, LocalState()).cap = requests

    async def add_tokens(self, agent: str, limits: Limits, tokens: int) -> None:
        if tokens and limits.tokens:
            self._states.setdefault(agent, LocalState()).tokens.append((time.monotonic(), tokens))

    def learned(self, agent: str) -> int:
        """The limit learned for `agent` (0: none)."""
        state = self._states.get(agent)
        return state.learned if state is not None else 0


# -- across the fleet (Redis; the scripts: limit_scripts.py) -------------------------------


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
        self._script: Any = self.client.register_script(ACQUIRE)
        self._clear_probe: Any = self.client.register_script(CLEAR_PROBE)
        self._adapt: Any = self.client.register_script(ADAPT)
        # Adaptive agents whose slots this process takes (it has seen a 429 or a pause);
        # the calls to the others it has in flight, taking none.
        self.engaged: set[str] = set()
        self.loose: dict[str, int] = {}
        self.held: dict[str, int] = {}  # the slots this process holds, by agent
        self.caps: dict[str, int] = {}  # the providers' request limits, when stated
        self.lines: dict[str, Line] = {}
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
        line: Line | None = None
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
                    line = self.lines.setdefault(agent, Line())
                    waits.begin()
                    await line.lock.acquire()
                    continue  # (a slot may have freed while this call waited its turn)
                await waits.sleep(max(float(wait), 0.005), line.wake)
        finally:
            if line is not None:
                line.lock.release()

    async def answered(self, agent: str, epoch: int, status: int | None) -> None:
        """AIMD on the agent's learned limit (limit_scripts.ADAPT), from one answer."""
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
            learned_changed(agent, limit, before)

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
