"""A dead agent: after a few calls that could not connect, the rest fail fast.

Each call retries on its own (backoff, jitter); against an agent that is down every case
used to spend its whole retry schedule before failing. The circuit breaker
(agents/limits/breaker.py) opens after AGENTTEST_BREAKER_FAILURES calls in a row could not
connect: later calls fail at once with "agent X unreachable since <time>", one call
probes now and then, and a call that gets an answer closes it again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent_servers import refused_url
from fault_kit import openai_agent, write_config

from agenttest_submit.cli.main import main
from agenttest_worker.agents.limits.breaker import LocalBreaker, RedisBreaker, Tripped, endpoint_key

CASES, PARALLEL = 80, 4
BASE_DELAY = 0.05  # a retry schedule of 0.175 to 0.35 s per call (3 retries, jitter)
SLOWEST_WITHOUT_BREAKER = CASES / PARALLEL * 3.5 * BASE_DELAY  # every case spends its retries


def _turns(results: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in results.read_text().splitlines() if line]
    assert len(records) == CASES and {r["status"] for r in records} == {"failed"}
    return [r["turns"][0] for r in records]


def test_a_dead_agent_fails_fast_after_a_few_calls(tmp_path: Path) -> None:
    # Credentials in the URL: the message names the agent, never its URL.
    dead = refused_url().replace("http://", "http://bob:s3cret-pw@") + "/v1"
    config = write_config(tmp_path, {"dead": openai_agent(dead, base_delay=BASE_DELAY)})
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "".join(json.dumps({"id": f"D{i}", "input": "hi"}) + "\n" for i in range(CASES))
    )
    results = tmp_path / "results.jsonl"
    started = time.monotonic()
    options = ["-n", "dead", "--config", str(config), "--parallel", str(PARALLEL)]
    code = main(["-i", str(cases), *options, "-o", str(results)])
    elapsed = time.monotonic() - started
    assert code == 1
    turns = _turns(results)
    errors = [t["error"] for t in turns]
    fast = [e for e in errors if "agent error: agent dead unreachable since " in e]
    # The first calls spend their retries (one lane each, and the ones the breaker found
    # mid-retry); every later case fails at once: in less than one call's retries take.
    assert len(fast) >= CASES - 2 * PARALLEL, errors
    at_once = [t["duration_ms"] for t in turns if t["error"] in fast]
    assert sum(ms < 3.5 * BASE_DELAY * 1000 for ms in at_once) >= CASES - 2 * PARALLEL, at_once
    # Without the breaker every case would spend its retries: this long at the least.
    assert elapsed < SLOWEST_WITHOUT_BREAKER, elapsed
    slow = [e for e in errors if e not in fast]
    assert slow and all(e.startswith("agent error: cannot reach dead (") for e in slow), slow
    for error in errors:
        assert "ssl:" not in error and "s3cret" not in error and "bob" not in error, error
    assert "Connection refused" in slow[0], slow[0]


KEY = endpoint_key("judge", "http://127.0.0.1:9/v1")


def test_the_breaker_opens_after_calls_in_a_row_closes_on_success_and_probes() -> None:
    async def scenario() -> None:
        breaker = LocalBreaker(failures=3, probe_after=0.2)
        for _ in range(2):
            await breaker.failed(KEY, "refused")
        await breaker.reached(KEY)  # an answer in between: not in a row any more
        for _ in range(2):
            await breaker.failed(KEY, "refused")
        assert await breaker.admit(KEY) is None
        await breaker.failed(KEY, "refused")
        tripped = await breaker.admit(KEY)
        assert tripped is not None
        assert tripped.message("judge").startswith("agent error: agent judge unreachable since ")
        await asyncio.sleep(0.25)
        assert await breaker.admit(KEY) is None, "one call probes"
        assert await breaker.admit(KEY) is not None, "the others wait for the probe"
        await breaker.reached(KEY)  # the agent is back
        assert await breaker.admit(KEY) is None
        assert await breaker.admit(KEY) is None

    asyncio.run(scenario())


def test_breaker_failures_zero_turns_it_off() -> None:
    async def scenario() -> None:
        breaker = LocalBreaker(failures=0, probe_after=0.3)
        for _ in range(10):
            await breaker.failed(KEY, "refused")
        assert await breaker.admit(KEY) is None

    asyncio.run(scenario())


def test_the_breaker_is_shared_through_redis(redis_db: str) -> None:
    """Two processes' breakers on one Redis: failures seen by one open it for both."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    async def soon(admit: Callable[[], Awaitable[Tripped | None]], tripped: bool) -> Tripped | None:
        """What `admit` answers once it turns tripped (or admitted): polled, 2 s at most."""
        deadline = time.monotonic() + 2
        while ((found := await admit()) is not None) != tripped:
            assert time.monotonic() < deadline, f"still {found!r}"
            await asyncio.sleep(0.01)
        return found

    async def scenario() -> None:
        outage = (OSError, RedisConnectionError)
        one, other = (
            RedisBreaker(
                aioredis.Redis.from_url(redis_db), outage, failures=3, probe_after=0.4, refresh=0.1
            )
            for _ in range(2)
        )
        assert await other.admit(KEY) is None  # read (and cached) before the failures
        for _ in range(3):
            opened = time.monotonic()
            await one.failed(KEY, "cannot connect to 127.0.0.1:9 (Connection refused)")
        # once what other has cached ages out
        tripped = await soon(lambda: other.admit(KEY), tripped=True)
        assert tripped is not None and "Connection refused" in tripped.message("judge")
        # past probe_after: one call probes, fleet-wide
        assert await soon(lambda: other.admit(KEY), tripped=False) is None
        assert time.monotonic() - opened >= 0.4, "admitted before probe_after"
        assert await one.admit(KEY) is not None
        await other.reached(KEY)
        # once what one has cached ages out
        assert await soon(lambda: one.admit(KEY), tripped=False) is None, (
            "the probe's answer closed it for every worker"
        )

    asyncio.run(scenario())


def test_turns_calling_at_once_read_a_shared_breaker_once(redis_db: str) -> None:
    """A hundred calls to one agent at the moment what the loop knows of its breaker ages
    out: one reads it from Redis, the others go on what the loop knew (closed, here);
    once it is open, calls made while it is read again are refused as before."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    class CountingRedis(aioredis.Redis):
        """A real client that counts the scripts it runs (the breaker's reads)."""

        scripts = 0

        async def evalsha(self, *args: Any, **kwargs: Any) -> Any:
            CountingRedis.scripts += 1
            return await super().evalsha(*args, **kwargs)

    async def scenario() -> None:
        client = CountingRedis.from_url(redis_db)
        breaker = RedisBreaker(
            client, (OSError, RedisConnectionError), failures=1, probe_after=30, refresh=0.05
        )
        answers = await asyncio.gather(*(breaker.admit(KEY) for _ in range(100)))
        assert answers == [None] * 100
        assert CountingRedis.scripts == 1
        await breaker.failed(KEY, "cannot connect to 127.0.0.1:9 (Connection refused)")
        await asyncio.sleep(0.06)  # what it knows ages out: the open breaker is read again
        before = CountingRedis.scripts
        refused = await asyncio.gather(*(breaker.admit(KEY) for _ in range(100)))
        assert all(isinstance(found, Tripped) for found in refused), refused
        assert CountingRedis.scripts == before + 1
        await client.aclose()

    asyncio.run(scenario())
