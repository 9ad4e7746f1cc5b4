"""A lean HTTP/1.1 client for the common agent call: a request to an `http://` URL whose
reply is read whole.

Why not aiohttp for these: a turn in flight is mostly an agent call waiting for its
reply, and aiohttp's objects for one request (the request and response, their headers,
a stream reader, timers, a writer task) hold ~9.6 KB while it waits. A worker keeping
10,000 turns in flight paid ~96 MB for them. Here a request in flight holds a future and
a timer, and a connection one small protocol object.

What this client does, as aiohttp does it (transport.py chooses it, and sends everything
else through aiohttp: TLS, proxies from the environment, credentials in the URL,
streamed replies): the URL quoted by yarl, the same Host header, gzip and deflate
replies, replies by length, chunked or read to the connection's close, 1xx replies
skipped, kept-alive connections per host closed after 15 s idle, redirects followed
(up to 10; one leaving plain HTTP is handed back, `Redirected`), an idempotent request
sent again once when a connection drops before its reply, and header values with
control characters refused. It keeps no cookies; neither does the aiohttp session.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from yarl import URL

from agenttest_worker.agents.breaker import connect_reason
from agenttest_worker.agents.http_connection import (
    ConnectFailure,
    Connection,
    HttpFailure,
    PlainReply,
    Target,
    header,
    request_head,
)

# An idle kept-alive connection is closed after this long (aiohttp's default).
KEEPALIVE_SECONDS = 15.0
# Resolved addresses are kept this long (as transport.py's aiohttp connector does).
DNS_TTL_SECONDS = 300.0
MAX_REDIRECTS = 10
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# The timer a call waits with needs no context variables: without this, each would
# copy the caller's context.
_NO_CONTEXT = contextvars.Context()


class Redirected(Exception):  # (not an error: a hand-over)
    """A redirect to a URL this client does not take: the caller goes on from there."""

    def __init__(self, method: str, url: str, body: bytes | None, hops: int) -> None:
        super().__init__(url)
        self.method = method
        self.url = url
        self.body = body
        self.hops = hops


class TooManyRedirects(HttpFailure):
    pass


@dataclass(slots=True)
class _Call:
    """What a call sends, which a redirect changes."""

    method: str
    target: Target
    headers: dict[str, str]
    payload: Callable[[], bytes | None]  # the body, made for each send
    hops: int = 0
    bodiless: bool = False  # a redirect turned it into a GET without its body

    def body(self) -> bytes | None:
        return None if self.bodiless else self.payload()

    def follow(self, status: int, location: str) -> None:
        """Follow a redirect as aiohttp does; Redirected where this client cannot."""
        self.hops += 1
        if self.hops >= MAX_REDIRECTS:
            raise TooManyRedirects(f"too many redirects, to {self.target.url}")
        try:
            following = self.target.url.join(URL(location))
        except ValueError:
            raise HttpFailure(f"redirect to an invalid URL: {location[:200]}") from None
        if following.scheme not in ("http", "https"):
            raise HttpFailure(f"redirect to a URL that is not HTTP: {location[:200]}")
        if status == 303 or (status in (301, 302) and self.method == "POST"):
            self.method, self.bodiless = "GET", True
        if following.origin() != self.target.url.origin():
            self.headers = {k: v for k, v in self.headers.items() if k.lower() != "authorization"}
        where = target(str(following))
        if where is None:
            raise Redirected(self.method, str(following), self.body(), self.hops)
        self.target = where


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


@lru_cache(maxsize=4096)
def target(url: str) -> Target | None:
    """`url` parsed, or None when this client does not take it (not http://, or with
    credentials, or without a host)."""
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        return None
    if parsed.scheme != "http" or parsed.user is not None or parsed.password is not None:
        return None
    host, port, host_header = parsed.raw_host, parsed.port, parsed.host_port_subcomponent
    if not host or port is None or host_header is None:
        return None
    return Target(parsed, host.strip("[]"), port, host_header, parsed.raw_path_qs or "/")


class PlainClient:
    """One event loop's connections, at most `size` requests at once (`gate`, which
    transport.py's aiohttp calls take too)."""

    def __init__(self, size: int) -> None:
        self.gate = asyncio.Semaphore(size)
        self._idle: dict[tuple[str, int], collections.deque[Connection]] = {}
        self._addresses: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._resolving: dict[tuple[str, int], asyncio.Future[list[Any]]] = {}

    async def request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        payload: Callable[[], bytes | None],
        timeout: float,
        limit: int,
    ) -> PlainReply:
        """One call: redirects followed, one reply read whole (at most `limit` bytes of
        body; more and it stops reading). TimeoutError after `timeout` seconds in all.

        One coroutine, from the request to its reply: each coroutine a waiting call
        holds costs its frame, at thousands of calls in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        where = target(url)
        assert where is not None, url
        call = _Call(method, where, headers, payload)
        again = method in IDEMPOTENT_METHODS  # sent once more if the connection drops
        while True:
            connection = await self._connection(call.target, deadline)
            body = call.body()
            length = len(body) if body is not None else None
            head = request_head(call.method, call.target, call.headers, length)
            waiter = connection.send(head, body, limit, call.method == "HEAD")
            del head, body  # (not kept while the reply is awaited)
            timer = loop.call_at(deadline, connection.time_out, context=_NO_CONTEXT)
            try:
                reply = await waiter
            except HttpFailure as exc:
                if again and exc.retryable:
                    again = False
                    continue
                raise
            except BaseException:
                connection.abort()  # cancelled mid-reply: the connection is of no more use
                raise
            finally:
                timer.cancel()
            self._release(connection)
            location = header(reply.headers, "Location") if reply.status in _REDIRECTS else None
            if not location:
                return reply
            call.follow(reply.status, location)
            again = call.method in IDEMPOTENT_METHODS

    async def _connection(self, target: Target, deadline: float) -> Connection:
        key = (target.host, target.port)
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since <= KEEPALIVE_SECONDS and connection.usable():
                return connection
            connection.close()
        async with asyncio.timeout_at(deadline):
            return await self._connect(target)

    async def _connect(self, target: Target) -> Connection:
        loop = asyncio.get_running_loop()
        key = (target.host, target.port)
        try:
            addresses = await self._resolve(target)
        except OSError as exc:
            raise ConnectFailure(connect_reason(target.host, target.port, exc)) from None
        first: OSError | None = None
        for family, _, proto, _, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                first = first or exc
                continue
            except BaseException:
                sock.close()
                raise
            return Connection(key, sock, loop)
        reason = connect_reason(target.host, target.port, first or OSError("no address"))
        raise ConnectFailure(reason)

    async def _resolve(self, target: Target) -> list[Any]:
        """The host's addresses: an IP address as it is (as aiohttp takes one), a name
        looked up once for all the calls waiting on it, and kept DNS_TTL_SECONDS.

        A run's first calls all start at once: each looking the name up on its own
        was as many lookups through the loop's thread pool, and its first connection
        waited for the loop to hand out all of them (~20 ms of a run's start-up for
        100 conversations against `127.0.0.1`)."""
        key = (target.host, target.port)
        known = self._addresses.get(key)
        if known is not None and time.monotonic() - known[0] < DNS_TTL_SECONDS:
            return known[1]
        try:
            # Answered at once for an IP address, without asking a resolver.
            return socket.getaddrinfo(
                target.host, target.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
            )
        except socket.gaierror:
            pass  # a name
        lookup = self._resolving.get(key)
        if lookup is None:
            lookup = asyncio.ensure_future(self._look_up(key))
            # Its failure is each waiting call's; with none left (all cancelled), it is
            # nobody's, and asyncio would log it as never retrieved.
            lookup.add_done_callback(_retrieved)
            self._resolving[key] = lookup
        # Shielded: a call cancelled while it waits does not cancel the others' lookup.
        return await asyncio.shield(lookup)

    async def _look_up(self, key: tuple[str, int]) -> list[Any]:
        try:
            loop = asyncio.get_running_loop()
            found = await loop.getaddrinfo(*key, type=socket.SOCK_STREAM)
            self._addresses[key] = (time.monotonic(), found)
            return found
        finally:
            del self._resolving[key]

    def _release(self, connection: Connection) -> None:
        if connection.closed:
            return
        now = time.monotonic()
        connection.idle_since = now
        idle = self._idle.setdefault(connection.key, collections.deque())
        idle.append(connection)
        while idle and now - idle[0].idle_since > KEEPALIVE_SECONDS:
            idle.popleft().close()

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
