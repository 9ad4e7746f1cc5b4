"""Rate limits learned from the provider: its headers read on every reply, and the calls
in flight to an agent with no `rate_limit` adapted to its 429s (AIMD).

The provider stand-in is a token bucket of R requests a second written from OpenAI's
and Anthropic's published rate-limit headers: each reply says what remains and when it
resets in that provider's own format, and a request beyond the bucket gets the
provider's 429 with `retry-after` (and OpenAI's `retry-after-ms`). The official clients
read it first. Then whole runs against it, embedded and on a fleet of two workers: the
run completes, every case passes, each case's call is answered exactly once, and the
429s stay few.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from agent_servers import AgentServer, Received, Reply, completion, run
from fleet import Fleet, fleet_on, free_port, write_cases
from stream_servers import anthropic_error, anthropic_message
from test_metrics import samples, scrape, total

from agenttest_submit.cli import main
from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentRequest
from agenttest_worker.agents.limits.provider_limits import (
    ProviderLimits,
    parse_duration,
    read_provider_limits,
)
from agenttest_worker.agents.limits.ratelimit import LEARNED, LocalLimiter, RedisLimiter
from agenttest_worker.agents.protocols.anthropic import AnthropicClient
from agenttest_worker.agents.protocols.openai import OpenAIClient

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
NOW = 1_800_000_000.0


# -- the provider stand-in ---------------------------------------------------------------


def go_duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it (Go's time.Duration): 20ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:g}s" if minutes else f"{rest:.3g}s"


def rfc3339(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")


class Bucket:
    """A provider's request limit: a token bucket of `per_second` tokens a second holding
    at most one second's worth, full at the start (or, `spent`, empty: someone else used
    it up just before). Every request is counted by what it
    got, and every answered one by its message (to see none is answered twice)."""

    def __init__(
        self, per_second: int, style: str = "openai", latency: float = 0.1, spent: bool = False
    ) -> None:
        self.per_second = per_second
        self.style = style
        self.latency = latency
        self.tokens = 0.0 if spent else float(per_second)
        self.stamp = self.began = time.monotonic()
        self.statuses: Counter[int] = Counter()
        self.answered: Counter[str] = Counter()
        # (seconds since the first request, status) of every request, for failures' messages.
        self.timeline: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        with self._lock:
            now = time.monotonic()
            self.tokens = min(
                float(self.per_second), self.tokens + (now - self.stamp) * self.per_second
            )
            self.stamp = now
            allowed = self.tokens >= 1
            if allowed:
                self.tokens -= 1
            self.statuses[200 if allowed else 429] += 1
            self.timeline.append((round(now - self.began, 3), 200 if allowed else 429))
            full_in = (self.per_second - self.tokens) / self.per_second
            next_in = max(0.0, (1 - self.tokens) / self.per_second)
            remaining = math.floor(self.tokens)
            if allowed:
                self.answered[_last_user(request.json)] += 1
        if self.style == "anthropic":
            headers = {
                "anthropic-ratelimit-requests-limit": str(self.per_second),
                "anthropic-ratelimit-requests-remaining": str(remaining),
                "anthropic-ratelimit-requests-reset": rfc3339(time.time() + full_in),
            }
            if not allowed:
                headers["retry-after"] = str(math.ceil(next_in))
                body = anthropic_error("rate_limit_error", "Number of requests has exceeded")
                return Reply(429, body=body, headers=headers)
            text = f"Noted: {_last_user(request.json)}"
            return Reply(body=anthropic_message(text), headers=headers, delay=self.latency)
        headers = {
            "x-ratelimit-limit-requests": str(self.per_second),
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": go_duration(full_in),
        }
        if not allowed:
            headers["retry-after"] = str(math.ceil(next_in))
            headers["retry-after-ms"] = str(math.ceil(next_in * 1000))
            body = {
                "error": {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
            return Reply(429, body=body, headers=headers)
        reply = completion(f"Noted: {_last_user(request.json)}")
        return Reply(body=reply, headers=headers, delay=self.latency)


def _last_user(body: Any) -> str:
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    content = users[-1]["content"] if users else ""
    return content if isinstance(content, str) else json.dumps(content)


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as agent:
        yield agent


# -- reading the headers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("7", 7.0),
        ("", None),
        ("soon", None),
        ("1x", None),
        ("-3", None),
        ("1s junk", None),
    ],
)
def test_durations_as_openai_writes_them(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        # Retry-After in seconds, as an HTTP date, and OpenAI's milliseconds winning.
        ({"Retry-After": "3"}, ProviderLimits(retry_after=3.0)),
        ({"retry-after": "Fri, 15 Jan 2027 08:00:05 GMT"}, ProviderLimits(retry_after=5.0)),
        ({"retry-after": "2", "retry-after-ms": "250"}, ProviderLimits(retry_after=0.25)),
        ({"retry-after-ms": "junk", "retry-after": "2"}, ProviderLimits(retry_after=2.0)),
        # OpenAI: a spent limit waits for its reset; the requests remaining are kept.
        (
            {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20ms"},
            ProviderLimits(exhausted_for=0.02, requests_remaining=0, requests_reset=0.02),
        ),
        (
            {
                "X-RateLimit-Remaining-Requests": "3",
                "X-RateLimit-Reset-Requests": "1s",
                "X-RateLimit-Remaining-Tokens": "0",
                "X-RateLimit-Reset-Tokens": "6m0s",
            },
            ProviderLimits(exhausted_for=360.0, requests_remaining=3, requests_reset=1.0),
        ),
        (
            {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "1s"},
            ProviderLimits(requests_remaining=5, requests_reset=1.0),
        ),
        # Anthropic: RFC 3339 times; the longest of the spent limits' resets.
        (
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:02Z",
                "anthropic-ratelimit-output-tokens-remaining": "0",
                "anthropic-ratelimit-output-tokens-reset": "2027-01-15T08:00:04.5+00:00",
                "anthropic-ratelimit-input-tokens-remaining": "900",
                "anthropic-ratelimit-input-tokens-reset": "2027-01-15T08:01:00Z",
            },
            ProviderLimits(exhausted_for=4.5, requests_remaining=0, requests_reset=2.0),
        ),
        (
            {
                "anthropic-ratelimit-tokens-remaining": "0",
                "anthropic-ratelimit-tokens-reset": "2027-01-15T07:59:00Z",  # past: no wait
            },
            ProviderLimits(exhausted_for=0.0),
        ),
        # Unreadable values are no signal at all, never an error.
        (
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": "2027-01-15 08:00:02",  # no zone
                "x-ratelimit-remaining-requests": "none",
                "x-ratelimit-reset-requests": "1s",
            },
            None,
        ),
        ({"Content-Type": "application/json"}, None),
    ],
)
def test_provider_headers_are_read(headers: dict[str, str], said: ProviderLimits | None) -> None:
    now = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC).timestamp()
    assert read_provider_limits(headers, now=now) == (said or ProviderLimits())


def test_openai_resets_count_from_the_request_and_the_stated_limit_is_kept() -> None:
    """OpenAI's relative reset was measured when the request arrived: a reply that took
    0.4 s leaves 0.6 s of a 1 s reset. Anthropic's are absolute times, unchanged."""
    now = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC).timestamp()
    openai_headers = {
        "x-ratelimit-limit-requests": "40",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
    }
    said = read_provider_limits(openai_headers, now=now, sent_ago=0.4)
    assert said == ProviderLimits(None, pytest.approx(0.6), 0, pytest.approx(0.6), 40)
    anthropic_headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:01Z",
    }
    said = read_provider_limits(anthropic_headers, now=now, sent_ago=0.4)
    assert said == ProviderLimits(None, 1.0, 0, 1.0, 50)


# -- the stand-in speaks the providers' formats ----------------------------------------------


def test_the_official_openai_client_reads_the_bucket(server: AgentServer) -> None:
    bucket = Bucket(2, latency=0)
    server.respond(CHAT, bucket)
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="sk-test", max_retries=0)
    hi: Any = [{"role": "user", "content": "Hi"}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=hi)
    assert raw.parse().choices[0].message.content == "Noted: Hi"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    client.chat.completions.create(model="m", messages=hi)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="m", messages=hi)
    assert refused.value.code == "rate_limit_exceeded"
    assert 0 < int(refused.value.response.headers["retry-after-ms"]) <= 500
    # The client's own retry honours retry-after-ms and then gets its answer.
    patient = openai.OpenAI(base_url=server.url("/v1"), api_key="sk-test", max_retries=2)
    assert patient.chat.completions.create(model="m", messages=hi).choices[0].message.content
    assert bucket.statuses[429] >= 1


def test_the_official_anthropic_client_reads_the_bucket(server: AgentServer) -> None:
    bucket = Bucket(1, style="anthropic", latency=0)
    server.respond(MESSAGES, bucket)
    client = anthropic.Anthropic(base_url=server.url(), api_key="sk-ant-test", max_retries=0)
    hi: Any = [{"role": "user", "content": "Hi"}]
    raw = client.messages.with_raw_response.create(model="c", max_tokens=8, messages=hi)
    assert raw.parse().content[0].type == "text"
    reset = datetime.fromisoformat(raw.headers["anthropic-ratelimit-requests-reset"])
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert 0 < reset.timestamp() - time.time() <= 1.5
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model="c", max_tokens=8, messages=hi)
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.body == anthropic_error(
        "rate_limit_error", "Number of requests has exceeded"
    )


# -- one call at a time: the headers obeyed ------------------------------------------------


def _ask(client: OpenAIClient | AnthropicClient, text: str = "Hi") -> str:
    request = AgentRequest(role="target", messages=[{"role": "user", "content": text}])

    async def asked() -> str:
        return (await client.complete(request)).content or ""

    return asyncio.run(asked())


def _openai(server: AgentServer, **fields: Any) -> OpenAIClient:
    config = {"base_url": server.url("/v1"), "model": "m", "timeout": 5, "base_delay": 0.01}
    return OpenAIClient("provider", AgentConfig.model_validate({**config, **fields}))


def test_a_429_waits_what_retry_after_ms_says(server: AgentServer) -> None:
    server.script(
        CHAT,
        Reply(429, body={"error": {"message": "slow"}}, headers={"retry-after-ms": "400"}),
        Reply(body=completion("ok")),
    )
    client = _openai(server)
    reply = run(client.complete(AgentRequest(role="target", messages=[])))
    assert reply.content == "ok" and reply.call is not None and reply.call.attempts == 2
    # Not base_delay's 10 ms: the 400 ms the provider asked for.
    assert server.gaps(CHAT)[0] >= 0.4


def test_a_spent_openai_limit_holds_the_next_call_until_its_reset(server: AgentServer) -> None:
    spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "600ms"}
    server.script(CHAT, Reply(body=completion("one"), headers=spent))
    server.always(CHAT, Reply(body=completion("two")))
    client = _openai(server)

    async def twice() -> list[str]:
        request = AgentRequest(role="target", messages=[])
        return [(await client.complete(request)).content or "" for _ in range(2)]

    assert run(twice()) == ["one", "two"]
    assert server.gaps(CHAT)[0] >= 0.55  # (the reset counts from the first request)


def test_a_spent_anthropic_limit_holds_the_next_call_until_its_reset(
    server: AgentServer,
) -> None:
    def spent(request: Received) -> Reply:
        headers = {
            "anthropic-ratelimit-output-tokens-remaining": "0",
            "anthropic-ratelimit-output-tokens-reset": rfc3339(time.time() + 0.8),
        }
        return Reply(body=anthropic_message("ok"), headers=headers)

    server.respond(MESSAGES, spent)
    config = {"protocol": "anthropic", "base_url": server.url(), "model": "c", "timeout": 5}
    client = AnthropicClient("claude", AgentConfig.model_validate(config))

    async def twice() -> None:
        request = AgentRequest(role="target", messages=[{"role": "user", "content": "Hi"}])
        for _ in range(2):
            await client.complete(request)

    run(twice())
    assert server.gaps(MESSAGES)[0] >= 0.75


def test_requests_remaining_no_more_than_the_calls_on_their_way_hold_the_next(
    server: AgentServer,
) -> None:
    """One request left and one other call already on its way: it will take that one,
    so the calls after wait for the reset. One left and nothing else on its way: no wait."""
    left = {"x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "700ms"}
    client = _openai(server)
    request = AgentRequest(role="target", messages=[])

    async def two_then_one() -> None:
        first = asyncio.ensure_future(client.complete(request))
        second = asyncio.ensure_future(client.complete(request))
        await asyncio.wait([first, second], return_when=asyncio.FIRST_COMPLETED)
        await client.complete(request)
        await asyncio.gather(first, second)

    server.script(CHAT, Reply(body=completion("one"), headers=left))
    server.always(CHAT, Reply(body=completion("slow"), delay=1.0))
    run(two_then_one())
    arrivals = [r.at for r in server.requests(CHAT)]
    assert len(arrivals) == 3 and arrivals[2] - arrivals[0] >= 0.65, arrivals

    with AgentServer() as alone:
        alone.always(CHAT, Reply(body=completion("ok"), headers=left))
        client = _openai(alone)

        async def twice() -> None:
            for _ in range(2):
                await client.complete(request)

        run(twice())
        assert alone.gaps(CHAT)[0] < 0.5


def test_a_configured_rate_limit_is_not_adapted(server: AgentServer) -> None:
    server.always(CHAT, Reply(body=completion("ok")))
    client = _openai(server, rate_limit={"concurrency": 3})
    assert not client.limits.adaptive and client.limits.concurrency == 3
    assert _openai(server).limits == LEARNED


# -- AIMD ------------------------------------------------------------------------------------


def test_the_learned_limit_halves_once_per_window_and_grows_back() -> None:
    async def scenario() -> list[int]:
        limiter = LocalLimiter()
        seen: list[int] = []
        window = [await limiter.acquire("a", LEARNED, 5) for _ in range(8)]
        # A burst of 429s from one window of 8 calls: halved once, to 4. (A 500 is
        # neither a success nor a 429.)
        for lease in window[:5]:
            await lease.release(0, 429)
        for lease in window[5:]:
            await lease.release(0, 500)
        seen.append(limiter.learned("a"))
        # A fifth call waits while 4 are in flight, and goes when one ends.
        held = [await limiter.acquire("a", LEARNED, 5) for _ in range(4)]
        fifth = asyncio.ensure_future(limiter.acquire("a", LEARNED, 5))
        await asyncio.sleep(0.1)
        seen.append(int(fifth.done()))
        await held.pop().release(0, 500)
        held.append(await asyncio.wait_for(fifth, 1))
        # 429s from this new window halve once more, to 2.
        for lease in held[:2]:
            await lease.release(0, 429)
        seen.append(limiter.learned("a"))
        for lease in held[2:]:
            await lease.release(0, 500)
        # A window's worth of successes (2) with the window full: one more, to 3.
        kept = await limiter.acquire("a", LEARNED, 5)
        for _ in range(2):
            lease = await limiter.acquire("a", LEARNED, 5)
            await lease.release(0, 200)
        seen.append(limiter.learned("a"))
        await kept.release(0, 500)
        # ... but not while the window is not in use: one call at a time, 3 successes.
        for _ in range(3):
            lease = await limiter.acquire("a", LEARNED, 5)
            await lease.release(0, 200)
        seen.append(limiter.learned("a"))
        # Never below one.
        for _ in range(4):
            lease = await limiter.acquire("a", LEARNED, 5)
            await lease.release(0, 429)
        seen.append(limiter.learned("a"))
        return seen

    assert asyncio.run(scenario()) == [4, 0, 2, 3, 3, 1]


def test_the_learned_limit_grows_no_further_than_the_provider_allows() -> None:
    async def scenario() -> list[int]:
        limiter = LocalLimiter()
        limiter.provider_allows("a", 3)
        window = [await limiter.acquire("a", LEARNED, 5) for _ in range(10)]
        await window[0].release(0, 429)  # half of 10 is 5: the provider allows 3
        for lease in window[1:]:
            await lease.release(0, 500)
        learned = [limiter.learned("a")]
        kept = [await limiter.acquire("a", LEARNED, 5) for _ in range(2)]
        for _ in range(20):  # the window full, success after success
            lease = await limiter.acquire("a", LEARNED, 5)
            await lease.release(0, 200)
        for lease in kept:
            await lease.release(0, 200)
        return [*learned, limiter.learned("a")]

    assert asyncio.run(scenario()) == [3, 3]


def test_the_learned_limit_is_shared_through_redis(redis_db: str) -> None:
    async def scenario() -> tuple[int, int, list[float]]:
        # A prefix of this test's own (never FLUSHDB: it would drop the database's claim).
        prefix = f"t:learned:{secrets.token_hex(4)}"
        one, two = RedisLimiter(redis_db, prefix=prefix), RedisLimiter(redis_db, prefix=prefix)
        # Before any 429 a process takes no slot in Redis at all.
        loose = [await one.acquire("a", LEARNED, 5) for _ in range(6)]
        assert await one.learned("a") == 0 and not await one.client.keys(f"{prefix}*")
        await loose[0].release(0, 429)  # the first 429: half of the 6 in flight
        await loose[1].release(0, 429)  # (the same window: no second halving)
        for lease in loose[2:]:
            await lease.release(0, 200)
        after_first = await two.learned("a")
        # The other process takes slots once it has had a 429 itself (its call from
        # before, no halving), and then both share the 3 slots: a fourth call waits
        # until one of them ends.
        await (await two.acquire("a", LEARNED, 5)).release(0, 429)
        assert await two.learned("a") == 3
        held = [await one.acquire("a", LEARNED, 5) for _ in range(2)]
        held.append(await two.acquire("a", LEARNED, 5))
        started = time.monotonic()
        waiting = asyncio.ensure_future(two.acquire("a", LEARNED, 5))
        await asyncio.sleep(0.3)
        await held[0].release(0, 200)
        held[0] = await asyncio.wait_for(waiting, 2)
        waited = [time.monotonic() - started]
        await held[1].release(0, 429)  # this window's 429: halves for both
        shared = await one.learned("a")
        for lease in held[2:] + held[:1]:
            await lease.release(0, 200)
        for limiter in (one, two):
            await limiter.client.aclose()
        return after_first, shared, waited

    after_first, shared, waited = asyncio.run(scenario())
    assert after_first == 3 and shared == 1
    assert waited[0] >= 0.3


# -- whole runs ------------------------------------------------------------------------------


def _cases(directory: Path, count: int) -> Path:
    cases = [
        {
            "id": f"C{i}",
            "input": f"hello {i}",
            "assertions": [{"type": "contains", "value": f"Noted: hello {i}"}],
        }
        for i in range(count)
    ]
    return write_cases(directory, cases)


def _config(directory: Path, base_url: str) -> Path:
    path = directory / "agenttest.yaml"
    path.write_text(
        "agents:\n"
        "  provider:\n"
        "    protocol: openai\n"
        f"    base_url: {base_url}\n"
        "    model: m\n"
        "    timeout: 10s\n"
        "    max_retries: 3\n",
        encoding="utf-8",
    )
    return path


PER_SECOND = 10
CASES = 60


def _check_calls(bucket: Bucket, refusals: int) -> None:
    # Every case answered exactly once: none lost, none played twice.
    assert bucket.answered == Counter({f"hello {i}": 1 for i in range(CASES)})
    assert bucket.statuses[429] <= refusals, (bucket.statuses, str(bucket.timeline))


def test_an_embedded_run_learns_the_providers_limit(
    server: AgentServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = Bucket(PER_SECOND)
    server.respond(CHAT, bucket)
    cases, config = _cases(tmp_path, CASES), _config(tmp_path, server.url("/v1"))
    started = time.monotonic()
    code = main(["-i", str(cases), "-n", "provider", "--config", str(config), "--parallel", "20"])
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Passed:  {CASES}" in out, out
    # The first burst, up to 20 calls against a bucket of 10, may be refused in part;
    # after that the learned limit and the provider's headers keep the refusals to a few.
    _check_calls(bucket, refusals=20 - PER_SECOND + CASES // 10)
    # Near the provider's pace (60 calls at 10 a second, the first 10 at once), not held
    # up by pauses longer than the provider asked for.
    assert elapsed < (CASES - PER_SECOND) / PER_SECOND * 3, (elapsed, str(bucket.timeline))


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_a_fleet_learns_the_providers_limit_together(
    fleet: Fleet, server: AgentServer, tmp_path: Path
) -> None:
    # Spent at the start, so that the first calls are refused however slowly the workers
    # start them (on a busy machine they may never outrun a full bucket).
    bucket = Bucket(PER_SECOND, spent=True)
    server.respond(CHAT, bucket)
    cases, config = _cases(tmp_path, CASES), _config(tmp_path, server.url("/v1"))
    ports = [free_port(), free_port()]
    workers = [
        fleet.start(name, concurrency=10, wait=False, metrics_port=str(port))
        for name, port in zip(("a", "b"), ports, strict=True)
    ]
    for worker in workers:
        worker.wait_ready()
    done = fleet.submit(["-i", str(cases), "-n", "provider", "--config", str(config)])
    assert done.returncode == 0, done.stderr + fleet.logs()
    assert f"Passed:  {CASES}" in done.stdout, done.stdout
    # The calls already on their way when the first 429 came (up to both workers' 20),
    # and a few more.
    _check_calls(bucket, refusals=20 + CASES // 10)
    assert bucket.statuses[429] >= 1
    # Each worker shows the 429s it got and the limit it acts on.
    scraped = [samples(scrape(port)) for port in ports]
    counted = sum(total(found, "agenttest_agent_429_total", agent="provider") for found in scraped)
    assert counted == bucket.statuses[429]
    learned = [
        total(found, "agenttest_agent_learned_concurrency", agent="provider") for found in scraped
    ]
    assert max(learned) >= 1, learned
    assert _learned_on(fleet.broker_url, "provider") >= 1


def _learned_on(url: str, agent: str) -> int:
    """The learned limit a fleet keeps in Redis (what RedisLimiter.learned reads)."""

    async def read() -> int:
        limiter = RedisLimiter(url)
        try:
            return await limiter.learned(agent)
        finally:
            await limiter.client.aclose()

    return asyncio.run(read())
