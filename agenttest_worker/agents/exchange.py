"""One attempt of an agent call over HTTP, and the clients it goes through.

A call whose reply is read whole, to a plain `http://` URL without credentials, with no
proxy configured, goes through the lean client (plain_http.py): it holds a fraction of
aiohttp's memory per request in flight. Everything else goes through one aiohttp
session per event loop: TLS, proxies, credentials in the URL, streamed replies, and a
redirect from the lean client to any of those. Both fail the same way: TimeoutError,
`ConnectFailure` (could not connect, with the breaker's reason) or `HttpFailure` (no
reply that could be read), and both take a slot of one gate per loop, so that
AGENTTEST_HTTP_POOL_SIZE bounds the calls to agents under way, whichever client.
Neither keeps cookies: a cookie one conversation's agent set would be sent on every
other conversation's calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import weakref
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

from agenttest_worker.agents.breaker import unreachable_reason
from agenttest_worker.agents.http_connection import (
    USER_AGENT,
    ConnectFailure,
    HttpFailure,
    PlainReply,
)
from agenttest_worker.agents.plain_http import MAX_REDIRECTS, PlainClient, Redirected, target
from agenttest_worker.agents.streaming import Assembler, StreamSpec, read_stream
from agenttest_worker.json_values import body_bytes

if TYPE_CHECKING:
    import aiohttp

# aiohttp is imported where a call needs it, not here: a submitter that only enqueues a
# run to the fleet never calls an agent, and a run whose agents all take the lean
# client never needs it; importing aiohttp (which builds its TLS contexts at import)
# was a tenth of a submitter's start-up.

MAX_BODY_BYTES = 16 * 1024 * 1024
_SNIPPET = 200

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Clients] = (
    weakref.WeakKeyDictionary()
)
_pool_size = 200

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")


def configure_pool(size: int) -> None:
    """Agent calls under way at once per event loop (set before the first call)."""
    global _pool_size
    _pool_size = size


def connections_for(concurrency: int | None) -> int:
    """Agent calls at once per loop: AGENTTEST_HTTP_POOL_SIZE when set, else enough for
    every conversation in flight (never fewer than the setting's default). The same for
    a worker's `-c` and an embedded run's `--parallel`."""
    from agenttest_worker.settings import get_settings

    settings = get_settings()
    if "http_pool_size" in settings.model_fields_set:
        return settings.http_pool_size
    return max(settings.http_pool_size, concurrency or 0)


def _proxied() -> bool:
    """Whether to honour proxy settings from the environment.

    aiohttp's trust_env also reads ~/.netrc and the proxy variables on every request,
    through a thread hop each time; that is only worth it when a proxy is configured.
    """
    return any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARS)


def needs_aiohttp(calls: Iterable[tuple[str | None, bool]]) -> bool:
    """Whether any of these calls (its URL, or None for a protocol's default; whether
    its reply is streamed) goes through aiohttp rather than the lean client."""
    return _proxied() or any(
        url is None or streamed or target(url) is None for url, streamed in calls
    )


class _Clients:
    """A loop's lean client and its gate, and whether a proxy rules the lean one out."""

    def __init__(self) -> None:
        self.plain = PlainClient(_pool_size)
        # (Windows' default loop cannot watch a socket of its own: aiohttp there.)
        self.proxied = _proxied() or sys.platform == "win32"


def clients() -> _Clients:
    loop = asyncio.get_running_loop()
    current = _clients.get(loop)
    if current is None:
        current = _clients[loop] = _Clients()
    return current


def session() -> aiohttp.ClientSession:
    """The running event loop's aiohttp session."""
    import aiohttp  # at the first call that needs it, not at import (see above)

    loop = asyncio.get_running_loop()
    current = _sessions.get(loop)
    if current is None or current.closed:
        connector = aiohttp.TCPConnector(
            limit=_pool_size, limit_per_host=_pool_size, ttl_dns_cache=300
        )
        current = aiohttp.ClientSession(
            connector=connector,
            # Bodies are parsed by us (lenient, with clear errors), not by aiohttp.
            json_serialize=json.dumps,
            raise_for_status=False,
            trust_env=clients().proxied,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT},
        )
        _sessions[loop] = current
    return current


async def close_session() -> None:
    """Close the running loop's clients (end of an embedded run, worker shutdown)."""
    loop = asyncio.get_running_loop()
    current = _sessions.pop(loop, None)
    if current is not None and not current.closed:
        await current.close()
    plain = _clients.pop(loop, None)
    if plain is not None:
        plain.plain.close()


class Attempt:
    """One attempt of a call: what it sends, and what is known of its reply so far.

    It keeps the body as the caller's object, not as the JSON bytes it is sent as: those
    are made for each send (a retry, a redirect) and let go once sent, not held while
    the reply is awaited (a conversation's whole history, at thousands of calls in
    flight)."""

    __slots__ = (
        "assembler",
        "body",
        "headers",
        "method",
        "started",
        "status",
        "stream",
        "streamed",
        "timeout",
        "url",
    )

    def __init__(
        self,
        method: str,
        url: str,
        body: Any,
        headers: dict[str, str],
        timeout: float,
        stream: StreamSpec | None,
    ) -> None:
        self.method = method
        self.url = url
        self.body = body
        self.headers = headers
        self.timeout = timeout
        self.stream = stream
        self.assembler: Assembler | None = stream.assembler() if stream is not None else None
        self.status: int | None = None  # once known
        self.started = 0.0
        self.streamed = False  # the reply is being read as a stream of events

    def payload(self) -> bytes | None:
        """The body as sent: JSON; none at all for None (a GET of a chat history), not
        the JSON text "null"."""
        if self.body is None:
            return None
        return body_bytes(self.body)

    def exchange(self) -> Awaitable[PlainReply]:
        """Send the request and read the reply, whose body is at most MAX_BODY_BYTES + 1
        bytes (empty when streamed). Not a coroutine of its own: the caller awaits the
        client's (see PlainClient.request). A redirect the lean client does not follow
        raises Redirected: go on with `follow`."""
        found = clients()
        if self.stream is not None or found.proxied or target(self.url) is None:
            return self._aiohttp(self.method, self.url, self.payload(), MAX_REDIRECTS, self.timeout)
        self.started = asyncio.get_running_loop().time()
        limit = MAX_BODY_BYTES + 1
        return found.plain.request(
            self.method, self.url, self.headers, self.payload, self.timeout, limit
        )  # (the method: the client makes the bytes for each send)

    async def follow(self, moved: Redirected) -> PlainReply:
        """Go on through aiohttp from a redirect the lean client does not follow (to
        https://, say), within what is left of the attempt's time."""
        left = self.timeout - (asyncio.get_running_loop().time() - self.started)
        if left <= 0:
            raise TimeoutError
        hops = MAX_REDIRECTS - moved.hops
        return await self._aiohttp(moved.method, moved.url, moved.body, hops, left)

    async def _aiohttp(
        self, method: str, url: str, payload: bytes | None, redirects: int, timeout: float
    ) -> PlainReply:
        import aiohttp  # at the first call that needs it (see above)

        if self.stream is None:
            limit = aiohttp.ClientTimeout(total=timeout)
        else:
            limit = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        try:
            async with session().request(
                method,
                url,
                data=payload,
                headers=self.headers,
                timeout=limit,
                max_redirects=redirects,
            ) as response:
                self.status = response.status  # (a broken stream's record says it)
                headers = {k: v for k, v in response.headers.items()}
                stream, assembler = self.stream, self.assembler
                if stream is not None and assembler is not None and 200 <= response.status < 300:
                    # An agent asked for events that answers with one JSON body (it does
                    # not stream) is read as a whole reply: HttpResult.stream stays None.
                    # (NDJSON is often served as application/json: it is read as events.)
                    whole = stream.framing == "sse" and response.content_type == "application/json"
                    self.streamed = not whole
                if self.streamed and stream is not None and assembler is not None:
                    await read_stream(response.content, stream.framing, assembler)
                    return PlainReply(response.status, headers, b"")
                body = await _read_body(response.content, MAX_BODY_BYTES + 1)
                return PlainReply(response.status, headers, body)
        except TimeoutError:
            raise  # (aiohttp's own timeouts are ClientErrors too)
        except aiohttp.TooManyRedirects as exc:
            # (Its own text is "0, message='', url=...": say what happened.)
            last = exc.request_info.real_url
            raise HttpFailure(f"too many redirects, to {last}") from None
        except aiohttp.ClientConnectorError as exc:
            raise ConnectFailure(unreachable_reason(exc)) from None  # (its own text is noisy)
        except aiohttp.ClientError as exc:
            raise HttpFailure(describe(exc)) from None


async def _read_body(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body, up to `limit` bytes. aiohttp's `read(n)` returns what has arrived so far
    (up to n), not n bytes: a reply of a few hundred KB came back cut short."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await stream.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"
