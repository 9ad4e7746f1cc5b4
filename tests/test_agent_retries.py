"""Retries over real HTTP: what is retried, how long we wait, what the error says."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest
from agent_servers import AgentServer, Reply, completion, refused_url, run

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.limits.retry import RetryPolicy, is_retryable_status, parse_retry_after
from agenttest_worker.agents.protocols.http import HttpAgentClient
from agenttest_worker.agents.protocols.openai import OpenAIClient

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]
OK = Reply(body=completion("finally"))


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as running:
        yield running


def agent(base_url: str, **fields: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "protocol": "openai",
        "base_url": base_url,
        "model": "m",
        "timeout": 5,
        "max_retries": 3,
        "base_delay": 0.01,
        **fields,
    }
    return AgentConfig.model_validate(settings)


def call(config: AgentConfig) -> AgentReply:
    request = AgentRequest(role="target", messages=HELLO)
    return run(OpenAIClient("flaky", config).complete(request))


def failure(config: AgentConfig) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call(config)
    return caught.value


# -- retried -------------------------------------------------------------------------------


def test_429_with_retry_after_seconds_waits_then_succeeds(server: AgentServer) -> None:
    server.script(CHAT, Reply(429, body={"error": "slow down"}, headers={"Retry-After": "1"}), OK)
    reply = call(agent(server.url("/v1")))
    assert reply.content == "finally"
    assert len(server.requests(CHAT)) == 2
    [gap] = server.gaps(CHAT)
    assert 0.9 <= gap < 3
    assert reply.call is not None
    assert reply.call.attempts == 2 and reply.call.status_code == 200
    assert reply.call.latency_ms >= 900


def test_retry_after_as_an_http_date(server: AgentServer) -> None:
    # The first whole second (HTTP dates have whole seconds) at least 0.3 s ahead: the
    # wait is 0.3-1.3 s, far above the 10 ms backoff this agent would use without the
    # header.
    when = math.ceil(time.time() + 0.3)
    header = {"Retry-After": formatdate(when, usegmt=True)}
    server.script(CHAT, Reply(503, headers=header), OK)
    reply = call(agent(server.url("/v1")))
    assert reply.content == "finally"
    [gap] = server.gaps(CHAT)
    assert 0.2 <= gap < 3.5


def test_503_twice_then_200(server: AgentServer) -> None:
    server.script(CHAT, Reply(503, body="busy"), Reply(503, body="busy"), OK)
    reply = call(agent(server.url("/v1")))
    assert reply.content == "finally"
    assert len(server.requests(CHAT)) == 3 and server.pending(CHAT) == 0
    assert reply.call is not None and reply.call.attempts == 3
    # Every attempt sends the same request.
    assert len({r.body for r in server.requests(CHAT)}) == 1


@pytest.mark.parametrize("status", [408, 500, 502, 504, 599])
def test_other_retryable_statuses(server: AgentServer, status: int) -> None:
    server.script(CHAT, Reply(status, body="oops"), OK)
    assert call(agent(server.url("/v1"))).content == "finally"
    assert len(server.requests(CHAT)) == 2


def test_timeout_is_retried_then_reported(server: AgentServer) -> None:
    server.always(CHAT, Reply(body=completion("too late"), delay=3))
    started = time.monotonic()
    error = failure(agent(server.url("/v1"), timeout=0.15, max_retries=1))
    elapsed = time.monotonic() - started
    assert error.kind == "timeout"
    assert error.message.startswith("timeout after 0.15s")
    assert error.message.endswith("(after 2 attempts)")
    assert len(server.requests(CHAT)) == 2
    assert 0.3 <= elapsed < 2.5
    assert error.call is not None
    assert error.call.attempts == 2 and error.call.status_code is None
    assert error.call.error == error.message


def test_a_slow_first_attempt_then_a_fast_one_succeeds(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("late"), delay=2), OK)
    reply = call(agent(server.url("/v1"), timeout=0.3, max_retries=2))
    assert reply.content == "finally"
    assert reply.call is not None and reply.call.attempts == 2


def test_connection_refused_is_retried_and_reported() -> None:
    started = time.monotonic()
    error = failure(agent(refused_url() + "/v1", max_retries=2))
    assert time.monotonic() - started < 2
    assert error.kind == "connection"
    assert error.message.startswith("agent error: cannot reach flaky (")
    assert error.message.endswith("(after 3 attempts)")
    assert error.call is not None and error.call.attempts == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_not_retried(server: AgentServer, status: int) -> None:
    server.always(CHAT, Reply(status, body={"error": {"message": "bad request body"}}))
    error = failure(agent(server.url("/v1")))
    assert len(server.requests(CHAT)) == 1
    assert error.kind == "http"
    assert error.message.startswith(f"agent error: HTTP {status} from flaky: ")
    assert "bad request body" in error.message
    assert "attempts" not in error.message
    assert error.call is not None
    assert error.call.status_code == status and error.call.attempts == 1
    assert error.call.error == error.message


def test_retries_exhausted_reports_the_attempts(server: AgentServer) -> None:
    server.always(CHAT, Reply(503, body="<html><body>Service Unavailable</body></html>"))
    error = failure(agent(server.url("/v1"), max_retries=2))
    assert len(server.requests(CHAT)) == 3
    assert error.kind == "http"
    assert error.message == (
        'agent error: HTTP 503 from flaky: "<html><body>Service Unavailable</body></html>"'
        " (after 3 attempts)"
    )
    assert error.call is not None
    assert error.call.attempts == 3
    assert error.call.status_code == 503  # what the last attempt got
    assert error.call.error == error.message


def test_no_retries_means_one_attempt(server: AgentServer) -> None:
    server.always(CHAT, Reply(500, body="boom"))
    error = failure(agent(server.url("/v1"), max_retries=0))
    assert len(server.requests(CHAT)) == 1
    assert error.message == 'agent error: HTTP 500 from flaky: "boom"'


def test_retry_after_longer_than_we_wait_fails_at_once(server: AgentServer) -> None:
    server.always(CHAT, Reply(429, body="later", headers={"Retry-After": "3600"}))
    started = time.monotonic()
    error = failure(agent(server.url("/v1")))
    assert time.monotonic() - started < 1
    assert len(server.requests(CHAT)) == 1
    assert error.kind == "http"
    assert "HTTP 429" in error.message
    assert "Retry-After 3600s is longer than we wait" in error.message
    assert error.call is not None and error.call.status_code == 429


def test_html_with_status_200_is_a_parse_error_not_retried(server: AgentServer) -> None:
    page = "<!DOCTYPE html>\n<html><head><title>Login</title></head><body>Sign in</body></html>"
    server.always(CHAT, Reply(body=page, content_type="text/html; charset=utf-8"))
    error = failure(agent(server.url("/v1")))
    assert len(server.requests(CHAT)) == 1
    assert error.kind == "parse"
    assert "flaky replied with text/html, not JSON" in error.message
    assert '"<!DOCTYPE html> <html><head><title>Login</title>' in error.message
    assert error.raw == page
    assert error.call is not None and error.call.status_code == 200


def test_a_long_body_is_quoted_short(server: AgentServer) -> None:
    server.always(CHAT, Reply(body="x" * 5000, content_type="text/plain"))
    error = failure(agent(server.url("/v1")))
    assert "text/plain" in error.message
    assert '"' + "x" * 200 + '…"' in error.message
    assert len(error.message) < 400


def test_http_protocol_retries_the_same_way(server: AgentServer) -> None:
    server.script("/chat", Reply(502), Reply(body={"content": "ok"}))
    config = AgentConfig(protocol="http", url=server.url("/chat"), base_delay=0.01)
    reply = run(HttpAgentClient("h", config).complete(AgentRequest("target", HELLO)))
    assert reply.content == "ok"
    assert reply.call is not None and reply.call.attempts == 2


# -- the policy ------------------------------------------------------------------------------


def test_backoff_doubles_within_bounds_with_jitter() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=3.0)
    rng_state = random.getstate()
    try:
        random.seed(1234)
        for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (10, 3.0)]:
            delays = [policy.delay(attempt) for _ in range(200)]
            assert all(ceiling / 2 <= d <= ceiling for d in delays), attempt
            # Jitter: the waits are spread over the range, not one value.
            assert max(delays) - min(delays) > ceiling / 4
    finally:
        random.setstate(rng_state)


def test_retry_after_overrides_backoff_and_is_capped() -> None:
    policy = RetryPolicy(base_delay=10, max_retry_after=120)
    assert policy.delay(1, retry_after=1.5) == 1.5
    assert policy.delay(3, retry_after=0) == 0
    assert policy.delay(1, retry_after=500) == 120


def test_base_delay_comes_from_the_agent_config() -> None:
    config = AgentConfig(protocol="openai", base_url="http://x/v1", base_delay="250ms")
    assert OpenAIClient("a", config).policy == RetryPolicy(max_retries=3, base_delay=0.25)
    assert AgentConfig(protocol="openai", base_url="http://x/v1").base_delay == 0.5


@pytest.mark.parametrize(
    ("status", "retried"),
    [
        (200, False),
        (400, False),
        (401, False),
        (404, False),
        (408, True),
        (425, True),
        (429, True),
        (500, True),
        (503, True),
        (599, True),
    ],
)
def test_retryable_statuses(status: int, retried: bool) -> None:
    assert is_retryable_status(status) is retried


NOW = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1", 1.0),
        (" 120 ", 120.0),
        ("0.5", 0.5),
        ("-3", 0.0),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
        ("Wed, 21 Oct 2015 07:28:10 -0000", 10.0),  # zone-less: GMT, not local time
        ("Wed, 21 Oct 2015 09:28:10 +0200", 10.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # in the past: no wait
        ("soon", None),
        ("nan", None),
        ("inf", None),
        ("", None),
    ],
)
def test_parse_retry_after(value: str, seconds: float | None) -> None:
    assert parse_retry_after({"Retry-After": value}, now=NOW) == seconds


def test_parse_retry_after_absent_or_lowercase() -> None:
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    future = formatdate(time.time() + 30, usegmt=True)
    waited = parse_retry_after({"Retry-After": future})
    assert waited is not None and 28 <= waited <= 30
