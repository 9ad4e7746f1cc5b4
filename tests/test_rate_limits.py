"""Rate limits per agent: requests per second, concurrency, tokens, shared 429 backoff.

In process (the embedded default) and through Redis (what a fleet shares), against a
real HTTP agent that records when each request arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from agent_servers import AgentServer, Reply, completion, run

from agenttest_worker.agents.base import AgentRequest
from agenttest_worker.agents.openai import OpenAIClient
from agenttest_worker.agents.ratelimit import WINDOW_SLACK, Limits, LocalLimiter, RedisLimiter
from agenttest_worker.agents.registry import AgentConfig, RateLimit
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


def _max_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as agent:
        yield agent


def test_requests_per_second_hold_in_process(server: AgentServer) -> None:
    server.always(PATH, Reply(body=completion("ok")))
    client = _client(server, "limited-local", requests_per_second=4)

    async def burst() -> None:
        await asyncio.gather(*(client.complete(_request()) for _ in range(12)))

    started = time.monotonic()
    run(burst())
    arrivals = [r.at for r in server.requests(PATH)]
    assert len(arrivals) == 12
    assert _max_in_window(arrivals, 1.0) <= 4
    # 12 calls at 4 per second need at least two full windows after the first four.
    assert time.monotonic() - started >= 1.9


def test_concurrency_limit_caps_calls_in_flight(server: AgentServer) -> None:
    server.always(PATH, Reply(body=completion("ok"), delay=0.2))
    client = _client(server, "limited-concurrency", concurrency=2)

    async def burst() -> None:
        await asyncio.gather(*(client.complete(_request()) for _ in range(6)))

    run(burst())
    starts = sorted(r.at for r in server.requests(PATH))
    # With two in flight and 0.2 s each, the six calls arrive in three waves.
    assert starts[2] - starts[0] >= 0.18
    assert starts[4] - starts[2] >= 0.18


def test_tokens_per_minute_stop_calls_once_spent() -> None:
    async def scenario() -> float:
        limiter = LocalLimiter()
        limits = Limits(tokens=100, token_window=0.5)
        lease = await limiter.acquire("a", limits, 5)
        await lease.release(0)
        await limiter.add_tokens("a", limits, 150)  # over the budget for this window
        started = time.monotonic()
        lease = await limiter.acquire("a", limits, 5)
        await lease.release(0)
        return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert 0.4 <= waited < 2.0


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
    limits = Limits(requests=3, request_window=1.0 + WINDOW_SLACK)

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
    assert _max_in_window(stamps, 1.0) <= 3


def test_redis_pause_reaches_the_other_limiter(redis_db: str) -> None:
    async def scenario() -> float:
        setter = RedisLimiter(redis_db, prefix="t:pause")
        waiter = RedisLimiter(redis_db, prefix="t:pause")
        await setter.pause("agent", 0.6)
        started = time.monotonic()
        lease = await waiter.acquire("agent", Limits(), 5)
        await lease.release(0)
        await setter.client.aclose()
        await waiter.client.aclose()
        return time.monotonic() - started

    assert 0.5 <= asyncio.run(scenario()) < 2.0


def test_the_broker_decides_which_limiter(monkeypatch: pytest.MonkeyPatch, redis_db: str) -> None:
    from agenttest_worker.agents.ratelimit import limiter

    async def kind() -> str:
        return type(limiter()).__name__

    assert asyncio.run(kind()) == "LocalLimiter"
    monkeypatch.setenv("AGENTTEST_BROKER_URL", redis_db)
    get_settings.cache_clear()
    assert asyncio.run(kind()) == "RedisLimiter"
