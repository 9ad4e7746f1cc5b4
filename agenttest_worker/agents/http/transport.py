"""HTTP calls to agents, with retries, timing and bounded bodies.

Each attempt goes through exchange.py, on aiohttp (not httpx.AsyncClient: under a
hundred concurrent conversations its connection pool collapses, encode/httpx#3215;
DESIGN.md's measurements put aiohttp at several times its throughput on the same
machine).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from agenttest_worker.agents.http.exchange import (
    DEFAULT_ROUTE,
    MAX_BODY_BYTES,
    Attempt,
    ConnectFailure,
    HttpFailure,
    Route,
    describe,
)
from agenttest_worker.agents.http.streaming import Assembler, StreamFailure, StreamSpec, elapsed_ms
from agenttest_worker.agents.interface import AgentError
from agenttest_worker.agents.limits.breaker import breaker, endpoint_key
from agenttest_worker.agents.limits.provider_limits import (
    NOTHING,
    ProviderLimits,
    read_provider_limits,
)
from agenttest_worker.agents.limits.ratelimit import PAUSE_AFTER_429, Limits, limiter
from agenttest_worker.agents.limits.retry import RetryPolicy, is_retryable_status
from agenttest_worker.agents.limits.waiting import waiting
from agenttest_worker.errors import redact, url_secrets
from agenttest_worker.json_values import nested_deeper_than, too_deep_message
from agenttest_worker.observe import metrics, tracing
from agenttest_worker.results import AgentCallRecord, AgentRole

_SNIPPET = 200


@dataclass
class HttpResult:
    status: int
    headers: dict[str, str]
    text: str
    record: AgentCallRecord
    # A streamed reply: the assembler that read it (its reply is complete).
    stream: Assembler | None = None

    def json(self, agent: str) -> Any:
        """The body as JSON; anything else is a parse error naming what came back. A body
        nested deeper than the project stores (json_values.MAX_REPLY_DEPTH) is one too."""
        try:
            data = json.loads(self.text)
        except RecursionError:  # nested past the parser's own limit
            data = None
            too_deep = True
        except ValueError:
            kind = self.headers.get("Content-Type", "unknown content type").split(";")[0]
            raise AgentError(
                "parse",
                f"agent error: {agent} replied with {kind}, not JSON: {snippet(self.text)}",
                call=self.record,
                raw=self.text[:4096],
            ) from None
        else:
            too_deep = nested_deeper_than(data, text=self.text)
        if too_deep:
            raise AgentError(
                "parse",
                f"agent error: {agent}'s reply is {too_deep_message('JSON')}",
                call=self.record,
                raw=self.text[:4096],
            )
        return data


def snippet(text: str) -> str:
    flat = " ".join(text.split())
    return json.dumps(flat if len(flat) <= _SNIPPET else flat[:_SNIPPET] + "…", ensure_ascii=False)


def masked(error: AgentError, hidden: Collection[str]) -> AgentError:
    """`error` with its message, the agent's reply it keeps and its call record redacted
    (errors.redact): aiohttp's errors, a gateway's error page and a redirect quote the
    URL, which may hold a password or a key from the environment."""
    error.message = redact(error.message, hidden)
    error.args = (error.message,)
    if error.raw is not None:
        error.raw = redact(error.raw, hidden)
    if error.call is not None and error.call.error is not None:
        error.call.error = redact(error.call.error, hidden)
    # The aiohttp error it was raised from quotes the URL whole; it is not shown anywhere
    # (the message says what it said), so it is not kept for a traceback to show either.
    error.__cause__ = None
    error.__suppress_context__ = True
    return error


async def post_json(
    *,
    url: str,
    body: Any,
    headers: dict[str, str],
    timeout: float,
    policy: RetryPolicy,
    role: AgentRole,
    agent: str,
    method: str = "POST",
    limits: Limits | None = None,
    hidden: Collection[str] = (),
    stream: StreamSpec | None = None,
    route: Route = DEFAULT_ROUTE,
) -> HttpResult:
    """Send `body` as JSON, retrying per `policy`; raise AgentError once retries are spent.

    With `limits`, every attempt first waits for a slot of the agent's rate limits, and
    a 429 pauses every caller of the agent (fleet-wide when distributed): for its
    Retry-After, or without one PAUSE_AFTER_429 under configured limits (learned ones
    halve instead: ratelimit.py). A reply saying one of the provider's limits is spent
    (provider_limits.py) pauses them until it resets. The error never
    shows the secrets of `url` (its password, its key-like query values) nor `hidden`.

    With `stream`, a 2xx body is read as a stream of events, and `timeout` bounds each
    wait for the next piece (the first included), not the whole reply: a long answer
    that keeps coming is not cut, one that goes silent is. An attempt that fails before
    any content arrived is retried as any other; after that the call fails at once,
    keeping what arrived (`AgentError.partial`).

    `route` is the agent's TLS context and proxy choice (exchange.Route): by default,
    the environment's trust and proxies.
    """
    # One coroutine, not a wrapper around another: each coroutine a waiting call holds
    # costs its frame, at thousands of calls in flight.
    try:
        accept = "text/event-stream" if stream is not None and stream.framing == "sse" else None
        if stream is not None and stream.framing == "ndjson":
            accept = "application/x-ndjson"
        all_headers = {
            **({"Content-Type": "application/json"} if body is not None else {}),
            "Accept": accept or "application/json",
            # The turn's trace context (observe/tracing.py); an agent's own headers win.
            **tracing.propagation_headers(),
            **headers,
        }
        started = time.monotonic()
        attempts = 0
        key = endpoint_key(agent, url)
        unreachable: str | None = None  # why the last attempt could not connect
        while True:
            attempts += 1
            tripped = await breaker().admit(key)
            if tripped is not None:
                # The agent is down (agents/limits/breaker.py): fail now, not after every retry.
                if unreachable is not None:  # this call, too, ended unable to connect
                    await breaker().failed(key, unreachable)
                made = attempts - 1
                failure = AgentError("connection", tripped.message(agent))
                failure.message += f" (after {made} attempts)" if made > 1 else ""
                failure.call = _record(role, agent, started, made, None, failure.message)
                raise failure
            unreachable = None
            retry_after: float | None = None
            attempt = Attempt(method, url, body, all_headers, timeout, stream, hidden, route)
            lease = await limiter().acquire(agent, limits, timeout) if limits is not None else None
            sent = time.monotonic()
            try:
                reply = await attempt.exchange()
            except StreamFailure as exc:
                failure = AgentError("stream", exc.message, raw=exc.raw)
                if not exc.retryable or _started(attempt.assembler):
                    raise _broken(failure, attempt, role, agent, started, attempts) from None
            except TimeoutError:
                failure = AgentError("timeout", f"timeout after {timeout:g}s")
                if attempt.streamed and _started(attempt.assembler):
                    failure.message = f"timeout: {agent}'s stream went silent for {timeout:g}s"
                    raise _broken(failure, attempt, role, agent, started, attempts) from None
            except ConnectFailure as exc:
                unreachable = exc.reason
                failure = AgentError(
                    "connection", f"agent error: cannot reach {agent} ({unreachable})"
                )
            except HttpFailure as exc:
                failure = AgentError(
                    "connection", f"agent error: cannot reach {agent} ({describe(exc)})"
                )
                if attempt.streamed:
                    failure.message = f"agent error: {agent}'s stream broke off ({describe(exc)})"
                    if _started(attempt.assembler):
                        raise _broken(failure, attempt, role, agent, started, attempts) from None
            else:
                await breaker().reached(key)
                status, response_headers, raw = reply.status, reply.headers, reply.body
                attempt.status = status
                said = read_provider_limits(response_headers, sent_ago=time.monotonic() - sent)
                if limits is not None and said is not NOTHING:
                    if said.requests_limit and limits.adaptive:
                        limiter().provider_allows(agent, said.requests_limit)
                    await _spent_until_reset(agent, said, policy)
                text = raw[:MAX_BODY_BYTES].decode("utf-8", errors="replace")
                record = _record(role, agent, started, attempts, status)
                if 200 <= status < 300:
                    if len(raw) > MAX_BODY_BYTES:
                        raise AgentError(
                            "parse",
                            f"agent error: reply over {MAX_BODY_BYTES >> 20} MB",
                            call=record,
                        )
                    if not attempt.streamed:
                        return HttpResult(status, response_headers, text, record)
                    assembler = attempt.assembler
                    assert assembler is not None
                    record.first_token_ms = elapsed_ms(started, assembler.first_token_at)
                    return HttpResult(status, response_headers, text, record, assembler)
                failure = AgentError(
                    "http",
                    f"agent error: HTTP {status} from {agent}: {snippet(text)}",
                    raw=text[:4096],
                )
                if not is_retryable_status(status):
                    record.error = failure.message
                    failure.call = record
                    raise failure
                retry_after = said.retry_after
                if status == 429:
                    metrics.answered_429(agent)
                    if limits is not None and (retry_after is not None or not limits.adaptive):
                        await limiter().pause(agent, retry_after or PAUSE_AFTER_429)
                if retry_after is not None and retry_after > policy.max_retry_after:
                    failure.message += f" (Retry-After {retry_after:g}s is longer than we wait)"
                    record.error = failure.message
                    failure.call = record
                    raise failure
            finally:
                if lease is not None:
                    await lease.release(0, attempt.status)
            if attempts > policy.max_retries:
                if unreachable is not None:
                    await breaker().failed(key, unreachable)
                if attempts > 1:
                    failure.message += f" (after {attempts} attempts)"
                # The last attempt's status (a 503, or none for a timeout): what it ended on.
                failure.call = _record(
                    role, agent, started, attempts, attempt.status, failure.message
                )
                raise failure
            metrics.retried(agent, role, failure.kind, attempt.status)
            with waiting():  # a long back-off must not make the turn look lost (waiting.py)
                await asyncio.sleep(policy.delay(attempts, retry_after))
    except AgentError as error:
        raise masked(error, [*url_secrets(url), *hidden]) from None


async def _spent_until_reset(agent: str, said: ProviderLimits, policy: RetryPolicy) -> None:
    """A limit the reply says is spent (or that the calls already on their way will spend,
    the requests remaining being no more than they): every call to the agent waits for
    its reset instead of being sent to fail. No probe after it: the provider said when
    it has room again. (A reset is when the limit is whole again, so that waiting for it
    loses none of the provider's allowance: it only refills meanwhile.)"""
    wait = said.exhausted_for
    remaining, reset = said.requests_remaining, said.requests_reset
    known = remaining is not None and reset is not None
    if not wait and known and remaining is not None and remaining <= limiter().calls_ahead(agent):
        wait = reset
    if wait:
        await limiter().pause(agent, min(wait, policy.max_retry_after), probe=False)


def _started(assembler: Assembler | None) -> bool:
    return assembler is not None and assembler.first_token_at is not None


def _broken(
    failure: AgentError,
    attempt: Attempt,
    role: AgentRole,
    agent: str,
    started: float,
    attempts: int,
) -> AgentError:
    """A stream that failed for good: its call record, and what it had sent."""
    failure.call = _record(role, agent, started, attempts, attempt.status, failure.message)
    assembler = attempt.assembler
    if assembler is not None:
        failure.call.first_token_ms = elapsed_ms(started, assembler.first_token_at)
        failure.partial = assembler.reply()
        if failure.partial.usage is not None:
            failure.call.usage = failure.partial.usage
    if attempts > 1:
        failure.message += f" (after {attempts} attempts)"
        failure.call.error = failure.message
    return failure


def _record(
    role: AgentRole,
    agent: str,
    started: float,
    attempts: int,
    status: int | None,
    error: str | None = None,
) -> AgentCallRecord:
    return AgentCallRecord(
        role=role,
        agent=agent,
        latency_ms=int((time.monotonic() - started) * 1000),
        attempts=attempts,
        status_code=status,
        error=error,
    )
