"""Rate limits per agent: requests per second, concurrency, tokens, shared 429 backoff.

In process (the embedded default) and through Redis (what a fleet shares), against a
real HTTP agent that records when each request arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_servers import AgentServer, Reply, completion, run
from fault_kit import max_in_window

from agenttest_worker.agents.config import AgentConfig, RateLimit
from agenttest_worker.agents.interface import AgentRequest
from agenttest_worker.agents.limits.ratelimit import (
    WINDOW_SLACK,
    Limits,
    LocalLimiter,
    RedisLimiter,
)
from agenttest_worker.agents.protocols.openai import OpenAIClient
from agenttest_worker.settings import get_settings

PATH = "/v1/chat/completions"


def _client(server: AgentServer, name: str, **limit: int) -> OpenAIClient:
    config = AgentConfig(
        base_url=server.url("/v1"),
        model="m",
        timeout=5,
        max_retries=3,
        base_delay=0.05,
        rate_limit=RateLimit(**limit),
    )
    return OpenAIClient(name, config)


def _request() -> AgentRequest:
    return AgentRequest(role="target", messages=[{"role": "user", "content": "hi"}])


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as agent:
        yield agent


def test_requests_per_second_hold_in_process(server: AgentServer) -> None:
    server.always(PATH, Reply(body=completion("ok")))
    client = _client(server, "limited-local", requests_per_second=4)

    async def burst() -> None:
        await asyncio.gather(*(client.complete(_request()) for _ in range(8)))

    started = time.monotonic()
    run(burst())
    arrivals = [r.at for r in server.requests(PATH)]
    assert len(arrivals) == 8
    assert max_in_window(arrivals, 1.0) <= 4
    # 8 calls at 4 per second need a full window after the first four.
    assert time.monotonic() - started >= 1.0


def test_concurrency_limit_caps_calls_in_flight(server: AgentServer) -> None:
    server.always(PATH, Reply(body=completion("ok"), delay=0.05))
    client = _client(server, "limited-concurrency", concurrency=2)

    async def burst() -> None:
        await asyncio.gather(*(client.complete(_request()) for _ in range(6)))

    run(burst())
    starts = sorted(r.at for r in server.requests(PATH))
    # With two in flight and 0.05 s each, the six calls arrive in three waves.
    assert starts[2] - starts[0] >= 0.045
    assert starts[4] - starts[2] >= 0.045


def test_tokens_per_minute_stop_calls_once_spent() -> None:
    async def scenario() -> float:
        limiter = LocalLimiter()
        limits = Limits(tokens=100, token_window=0.1)
        lease = await limiter.acquire("a", limits, 5)
        await lease.release(0)
        await limiter.add_tokens("a", limits, 150)  # over the budget for this window
        started = time.monotonic()
        lease = await limiter.acquire("a", limits, 5)
        await lease.release(0)
        return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert 0.08 <= waited < 2.0


def test_a_429_pauses_every_caller_of_the_agent(server: AgentServer) -> None:
    server.script(PATH, Reply(429, headers={"Retry-After": "1"}))
    server.always(PATH, Reply(body=completion("ok")))
    client = _client(server, "backoff-local")

    async def two_callers() -> None:
        first = asyncio.create_task(client.complete(_request()))
        await asyncio.sleep(0.2)  # the 429 has been seen: the pause is in force
        second = asyncio.create_task(client.complete(_request()))
        await asyncio.gather(first, second)

    run(two_callers())
    requests = server.requests(PATH)
    assert len(requests) == 3
    # The second caller never sent anything during the first caller's pause.
    assert requests[1].at - requests[0].at >= 0.95
    assert requests[2].at - requests[0].at >= 0.95


def test_redis_limits_are_shared_between_limiters(redis_db: str) -> None:
    """Two limiters (as in two worker processes) on one Redis share the budget."""
    window = 0.1  # (a window of any length: 3 per tenth of a second here)
    limits = Limits(requests=3, request_window=window + WINDOW_SLACK)

    async def scenario() -> list[float]:
        first, second = (
            RedisLimiter(redis_db, prefix="t:shared"),
            RedisLimiter(redis_db, prefix="t:shared"),
        )
        stamps: list[float] = []

        async def take(limiter: RedisLimiter) -> None:
            lease = await limiter.acquire("agent", limits, 5)
            stamps.append(time.monotonic())
            await lease.release(0)

        await asyncio.gather(*(take(first) for _ in range(5)), *(take(second) for _ in range(4)))
        await first.client.aclose()
        await second.client.aclose()
        return stamps

    stamps = asyncio.run(scenario())
    assert len(stamps) == 9
    assert max_in_window(stamps, window) <= 3


def test_redis_pause_reaches_the_other_limiter(redis_db: str) -> None:
    async def scenario() -> float:
        setter = RedisLimiter(redis_db, prefix="t:pause")
        waiter = RedisLimiter(redis_db, prefix="t:pause")
        await setter.pause("agent", 0.1)
        started = time.monotonic()
        lease = await waiter.acquire("agent", Limits(), 5)
        await lease.release(0)
        await setter.client.aclose()
        await waiter.client.aclose()
        return time.monotonic() - started

    assert 0.08 <= asyncio.run(scenario()) < 2.0


def test_the_broker_decides_which_limiter(monkeypatch: pytest.MonkeyPatch, redis_db: str) -> None:
    from agenttest_worker.agents.limits.ratelimit import limiter

    async def kind() -> str:
        return type(limiter()).__name__

    assert asyncio.run(kind()) == "LocalLimiter"
    monkeypatch.setenv("AGENTTEST_BROKER_URL", redis_db)
    get_settings.cache_clear()
    assert asyncio.run(kind()) == "RedisLimiter"


def test_after_a_pause_one_probe_goes_before_the_others() -> None:
    """When a 429 pause ends, one call goes first; the rest wait for its answer."""

    async def scenario() -> tuple[float, list[float]]:
        limiter = LocalLimiter()
        await limiter.pause("agent", 0.1)
        started = time.monotonic()
        first = await limiter.acquire("agent", Limits(), 5)
        probe_at = time.monotonic() - started

        async def follower() -> float:
            lease = await limiter.acquire("agent", Limits(), 5)
            await lease.release(0, 200)
            return time.monotonic() - started

        followers = [asyncio.create_task(follower()) for _ in range(3)]
        await asyncio.sleep(0.1)  # the probe is still waiting for its reply
        assert not any(task.done() for task in followers)
        await first.release(0, 200)
        return probe_at, list(await asyncio.gather(*followers))

    probe_at, followers = asyncio.run(scenario())
    assert 0.08 <= probe_at < 0.4
    assert all(0.18 <= at < 0.6 for at in followers)


def test_a_probe_answered_by_429_keeps_the_fleet_waiting(redis_db: str) -> None:
    """Through Redis: a probe that meets another 429 re-pauses every limiter; the next
    probe goes only after the new pause, and then everyone is let through."""

    async def scenario() -> tuple[float, float]:
        one = RedisLimiter(redis_db, prefix="t:probe")
        other = RedisLimiter(redis_db, prefix="t:probe")
        await one.pause("agent", 0.05)
        started = time.monotonic()
        probe = await one.acquire("agent", Limits(), 5)
        waiting = asyncio.create_task(other.acquire("agent", Limits(), 5))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        # The agent answered the probe with another 429: the transport pauses, then releases.
        await one.pause("agent", 0.2)
        await probe.release(0, 429)
        second = await waiting  # itself the next probe
        second_at = time.monotonic() - started
        third = asyncio.create_task(one.acquire("agent", Limits(), 5))
        await asyncio.sleep(0.1)
        assert not third.done()
        await second.release(0, 200)
        await (await third).release(0, 200)
        third_at = time.monotonic() - started
        await one.client.aclose()
        await other.client.aclose()
        return second_at, third_at

    second_at, third_at = asyncio.run(scenario())
    assert second_at >= 0.3
    assert third_at - second_at < 0.5


def test_limits_wait_out_a_redis_restart(tmp_path: Path) -> None:
    """The broker down for a while: calls wait for it and then take their slot."""
    from fleet import RedisServer

    server = RedisServer(tmp_path / "redis")
    down = 0.3

    async def scenario() -> tuple[str, float]:
        limiter = RedisLimiter(server.url, prefix="t:outage", outage_grace=30)
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        restart = loop.run_in_executor(None, lambda: (time.sleep(down), server.start()))
        lease = await limiter.acquire("agent", Limits(requests=5), 5)
        waited = time.monotonic() - started
        await lease.release(0, 200)
        await restart
        await limiter.client.aclose()
        return type(lease).__name__, waited

    try:
        kind, waited = asyncio.run(scenario())
    finally:
        server.stop()
    assert kind == "_RedisLease"
    assert waited >= down


def test_an_unreachable_redis_never_fails_a_call(tmp_path: Path) -> None:
    """Past the grace period a call goes ahead unlimited; pausing, counting tokens and
    releasing are best effort and raise nothing."""
    from fleet import free_port

    async def scenario() -> tuple[str, float]:
        limiter = RedisLimiter(
            f"redis://127.0.0.1:{free_port()}/0", prefix="t:down", outage_grace=1.0
        )
        limits = Limits(requests=1, tokens=10)
        started = time.monotonic()
        lease = await limiter.acquire("agent", limits, 5)
        waited = time.monotonic() - started
        await limiter.pause("agent", 1)
        await limiter.add_tokens("agent", limits, 20)
        await lease.release(20, 429)
        await limiter.client.aclose()
        return type(lease).__name__, waited

    kind, waited = asyncio.run(scenario())
    assert kind == "_NoLease"
    assert 0.9 <= waited < 10
