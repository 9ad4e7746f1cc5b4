"""Agent calls (agents/http/exchange.py, through aiohttp) on the wire: what they send, every
way a reply can come back, and how a call fails, against hand-written servers on real
sockets."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agent_servers import refused_url, run
from raw_http import Answer, RawRequest, RawServer, reply

from agenttest_worker.agents.http import exchange
from agenttest_worker.agents.http.exchange import MAX_BODY_BYTES
from agenttest_worker.agents.http.transport import HttpResult, post_json
from agenttest_worker.agents.interface import AgentError
from agenttest_worker.agents.limits.retry import RetryPolicy

ONCE = RetryPolicy(max_retries=0)


async def call(url: str, *, timeout: float = 5, method: str = "POST", **more: Any) -> HttpResult:
    return await post_json(
        url=url,
        body={"q": "hi"} if method != "GET" else None,
        headers=more.pop("headers", {}),
        timeout=timeout,
        policy=more.pop("policy", ONCE),
        role="target",
        agent="raw",
        method=method,
        **more,
    )


async def failed(url: str, **more: Any) -> AgentError:
    with pytest.raises(AgentError) as caught:
        await call(url, **more)
    return caught.value


def served(
    answer: Callable[[RawRequest], Answer | None], test: Callable[[RawServer], Awaitable[None]]
) -> None:
    async def main() -> None:
        async with RawServer(answer) as server:
            await test(server)

    run(main())


# -- what it sends ------------------------------------------------------------------------------


def test_request_on_the_wire_and_one_kept_alive_connection() -> None:
    async def test(server: RawServer) -> None:
        for _ in range(3):
            result = await call(server.url("/v1/chat?x=a b&y=é"), headers={"X-Key": "k"})
            assert result.status == 200 and result.json("raw") == {"ok": True}
        first = server.requests[0]
        assert first.method == "POST"
        assert first.target == "/v1/chat?x=a+b&y=%C3%A9"  # quoted as yarl (aiohttp) quotes
        assert json.loads(first.body) == {"q": "hi"}
        assert first.header("Host") == server.url("").split("/")[2]
        assert first.header("Content-Length") == str(len(first.body))
        assert first.header("Content-Type") == "application/json"
        assert first.header("Accept") == "application/json"
        assert first.header("Accept-Encoding") == "gzip, deflate"
        assert first.header("User-Agent") == "agenttest"
        assert first.header("X-Key") == "k"
        assert server.connections == 1  # kept alive, used again

    served(lambda request: reply(), test)


def test_credentials_in_the_url_are_sent_as_authorization() -> None:
    """Apart from the Authorization they become, the agent sees the same request."""

    async def test(server: RawServer) -> None:
        await call(server.url("/a"))
        await call(server.url("/a").replace("http://", "http://u:p@"))
        plain, credentialed = server.requests
        assert credentialed.header("Authorization") == "Basic dTpw"
        assert plain.header("Authorization") is None

        def seen(request: RawRequest) -> dict[str, str]:
            return {k.lower(): v for k, v in request.headers if k.lower() != "authorization"}

        assert seen(plain) == seen(credentialed)
        assert plain.target == credentialed.target and plain.body == credentialed.body

    served(lambda request: reply(), test)


def test_a_large_request_is_sent_whole_while_the_agent_reads_it() -> None:
    """8 MB, more than a socket takes at once: the rest goes as the agent reads."""
    text = "x" * (8 << 20)

    async def test(server: RawServer) -> None:
        result = await post_json(
            url=server.url("/big"),
            body={"q": text},
            headers={},
            timeout=30,
            policy=ONCE,
            role="target",
            agent="raw",
        )
        assert result.status == 200
        assert json.loads(server.requests[0].body) == {"q": text}
        assert (await call(server.url("/after"))).status == 200  # the connection is fine
        assert server.connections == 1

    served(lambda request: reply(), test)


def test_a_header_that_smuggles_another_in_is_refused() -> None:
    async def test(server: RawServer) -> None:
        with pytest.raises(ValueError, match="header injection"):
            await call(server.url(), headers={"X-Key": "k\r\nX-Evil: 1"})
        assert not server.requests

    served(lambda request: reply(), test)


def test_no_cookies_are_kept() -> None:
    """A cookie one conversation's agent sets is never sent on another's calls."""

    async def test(server: RawServer) -> None:
        await call(server.url("/a"))
        await call(server.url("/a"))
        await call(server.url("/a").replace("http://", "http://u:p@"))
        await call(server.url("/a").replace("http://", "http://u:p@"))
        assert [r.header("Cookie") for r in server.requests] == [None] * 4

    served(lambda request: reply(headers={"Set-Cookie": "session=abc; Path=/"}), test)


# -- replies --------------------------------------------------------------------------------------


def _head(lines: str) -> bytes:
    return lines.replace("\n", "\r\n").encode() + b"\r\n"


def test_chunked_reply_split_across_reads_with_extensions_and_trailers() -> None:
    body = json.dumps({"reply": "x" * 3000}).encode()
    pieces = [
        _head("HTTP/1.1 200 OK\nTransfer-Encoding: chunked\nContent-Type: application/json\n")
    ]
    for start in range(0, len(body), 1000):
        chunk = body[start : start + 1000]
        pieces += [f"{len(chunk):x};ext=1\r\n".encode(), chunk[:7], chunk[7:] + b"\r\n"]
    pieces += [b"0\r\nX-Trailer: t\r\n", b"\r\n"]

    async def test(server: RawServer) -> None:
        result = await call(server.url())
        assert result.json("raw") == {"reply": "x" * 3000}
        assert (await call(server.url())).status == 200  # the connection is still good
        assert server.connections == 1

    served(lambda request: Answer(pieces, pause=0.002), test)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
def test_compressed_replies_are_undone(coding: str) -> None:
    body = json.dumps({"reply": "compressed " * 100}).encode()
    if coding == "gzip":
        packed = gzip.compress(body)
    elif coding == "deflate":
        packed = zlib.compress(body)
    else:  # deflate as some servers send it: without the zlib header
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = packer.compress(body) + packer.flush()
    name = "gzip" if coding == "gzip" else "deflate"

    async def test(server: RawServer) -> None:
        result = await call(server.url())
        assert result.text == body.decode()

    served(lambda request: reply(body=packed, headers={"Content-Encoding": name}), test)


def test_reply_read_to_the_close_and_informational_replies_skipped() -> None:
    pieces = [
        _head("HTTP/1.1 100 Continue\n"),
        _head("HTTP/1.0 200 OK\nContent-Type: application/json\n"),
        b'{"a": ',
        b"1}",
    ]

    async def test(server: RawServer) -> None:
        assert (await call(server.url())).json("raw") == {"a": 1}
        assert (await call(server.url())).json("raw") == {"a": 1}
        assert server.connections == 2  # a reply read to the close leaves no connection

    served(lambda request: Answer(pieces, close=True), test)


def test_a_kept_connection_the_agent_closed_is_not_an_error() -> None:
    """The agent answers with Connection: close, or closes a kept-alive connection while
    it idles: the next call opens a new one and succeeds."""
    replies = iter(
        [reply(headers={"Connection": "close"}, close=True), reply(close=True), reply(), reply()]
    )

    async def test(server: RawServer) -> None:
        for _ in range(3):
            assert (await call(server.url())).status == 200
            await asyncio.sleep(0.1)  # the agent's close has arrived
        assert server.connections == 3

    served(lambda request: next(replies), test)


def test_a_reply_over_the_limit_is_refused_without_reading_the_rest() -> None:
    """A reply announcing 100 MB: reading stops past 16 MB, the call fails at once (not
    at its timeout), and the connection, with the rest unread, is not used again."""
    head = _head("HTTP/1.1 200 OK\nContent-Length: 100000000\n")
    big = Answer([head, b"x" * (MAX_BODY_BYTES + 1024)])

    async def test(server: RawServer) -> None:
        started = time.monotonic()
        error = await failed(server.url("/big"), timeout=30)
        assert error.kind == "parse" and "over 16 MB" in error.message
        assert time.monotonic() - started < 10
        assert (await call(server.url("/small"))).status == 200
        assert server.connections == 2

    served(lambda r: big if r.target == "/big" else reply(), test)


def test_error_statuses_are_read_like_any_reply() -> None:
    async def test(server: RawServer) -> None:
        error = await failed(server.url())
        assert (
            error.kind == "http"
            and "HTTP 404 from raw" in error.message
            and "nope" in error.message
        )

    served(lambda request: reply(404, body=b"nope"), test)


# -- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "words"),
    [
        ([b"HTTP/1.1 OK\r\n\r\n"], "Bad status line"),
        ([b"SMTP ready\r\n\r\n"], "Bad status line"),
        ([_head("HTTP/1.1 200 OK\nbroken header line\n")], "Invalid header token"),
        ([_head("HTTP/1.1 200 OK\nContent-Length: 100\n"), b"short"], "payload is not completed"),
        ([_head("HTTP/1.1 200 OK\nContent-Length: -1\n")], "Invalid character in Content-Length"),
        (
            [_head("HTTP/1.1 200 OK\nContent-Encoding: gzip\nContent-Length: 3\n") + b"abc"],
            "decode",
        ),
        ([b"HTTP/1.1 200 OK\r\n"], "Server disconnected"),
        ([], "Server disconnected"),
        ([b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000], "Got more than 8190 bytes"),
    ],
)
def test_a_broken_reply_fails_the_call_as_a_connection_error(
    pieces: list[bytes], words: str
) -> None:
    async def test(server: RawServer) -> None:
        error = await failed(server.url())
        assert error.kind == "connection", error.message
        assert (
            error.message.startswith("agent error: cannot reach raw (") and words in error.message
        )
        assert error.call is not None and error.call.attempts == 1

    served(lambda request: Answer(pieces, close=True), test)


def test_a_broken_chunk_fails_the_call_at_its_timeout() -> None:
    """A chunk size that is not hex, the connection then closed: aiohttp's C parser
    raises its error on the connection, not on the body being read, which waits for
    the rest until the call's timeout (over http and https alike). To report upstream:
    ResponseHandler.data_received should fail the payload too."""
    pieces = [_head("HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n"), b"zz\r\n"]

    async def test(server: RawServer) -> None:
        error = await failed(server.url(), timeout=0.5)
        assert error.kind == "timeout" and error.message == "timeout after 0.5s"

    served(lambda request: Answer(pieces, close=True), test)


def test_refused_connection_says_so() -> None:
    async def main() -> None:
        url = refused_url()
        error = await failed(url + "/chat")
        port = url.rsplit(":", 1)[1]
        reason = f"cannot connect to 127.0.0.1:{port}: Connection refused"
        assert error.message == f"agent error: cannot reach raw ({reason})"

    run(main())


def test_unknown_host_says_so() -> None:
    async def main() -> None:
        error = await failed("http://no-such-host.invalid/chat")
        assert error.kind == "connection"
        assert "cannot connect to no-such-host.invalid:80:" in error.message

    run(main())


def test_an_agent_that_never_answers_times_out_and_is_not_reused() -> None:
    async def test(server: RawServer) -> None:
        started = time.monotonic()
        error = await failed(server.url("/hang"), timeout=0.5)
        assert error.kind == "timeout" and error.message == "timeout after 0.5s"
        assert 0.45 < time.monotonic() - started < 2
        assert (await call(server.url("/ok"))).json("raw") == {"ok": True}
        assert server.connections == 2

    served(lambda r: None if r.target == "/hang" else reply(), test)


def test_a_cancelled_call_leaves_no_reply_behind_for_the_next() -> None:
    async def test(server: RawServer) -> None:
        slow = asyncio.ensure_future(call(server.url("/slow")))
        await asyncio.sleep(0.1)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        result = await call(server.url("/fast"))
        assert result.json("raw") == {"which": "fast"}
        await asyncio.sleep(0.5)  # the slow reply would have come by now

    def answer(request: RawRequest) -> Answer:
        if request.target == "/slow":
            late = reply(body=b'{"which": "slow"}')
            return Answer([b"", *late.pieces], pause=0.3)
        return reply(body=b'{"which": "fast"}')

    served(answer, test)


def test_a_dropped_get_is_sent_once_more_a_dropped_post_is_not() -> None:
    """As aiohttp: a connection lost before any reply sends an idempotent request again
    (once); a POST fails (and is retried only as the agent's retry policy says)."""
    drops = {"GET": 1, "POST": 1}

    def answer(request: RawRequest) -> Answer:
        if drops[request.method]:
            drops[request.method] -= 1
            return Answer([], close=True)
        return reply()

    async def test(server: RawServer) -> None:
        assert (await call(server.url(), method="GET")).status == 200
        error = await failed(server.url())
        assert "Server disconnected" in error.message
        assert [r.method for r in server.requests] == ["GET", "GET", "POST"]

    served(answer, test)


# -- redirects -----------------------------------------------------------------------------------


def test_redirects_are_followed() -> None:
    def answer(request: RawRequest) -> Answer:
        if request.target == "/temporary":
            return reply(307, headers={"Location": "/moved"})
        if request.target == "/found":
            return reply(302, headers={"Location": "/moved"})
        return reply(
            body=json.dumps({"method": request.method, "body": request.body.decode()}).encode()
        )

    async def test(server: RawServer) -> None:
        kept = (await call(server.url("/temporary"))).json("raw")
        assert kept == {"method": "POST", "body": '{"q":"hi"}'}  # 307 keeps the method and body
        changed = (await call(server.url("/found"))).json("raw")
        assert changed == {"method": "GET", "body": ""}  # 302 after a POST is a GET

    served(answer, test)


def test_a_redirect_loop_ends_after_ten() -> None:
    async def test(server: RawServer) -> None:
        error = await failed(server.url("/loop"))
        assert error.kind == "connection" and "too many redirects, to " in error.message
        assert len(server.requests) == 10

    served(lambda request: reply(307, headers={"Location": "/loop"}), test)


def test_a_redirect_to_https_is_followed() -> None:
    async def test(server: RawServer) -> None:
        port = refused_url().rsplit(":", 1)[1]
        server.answer = lambda request: reply(
            308, headers={"Location": f"https://127.0.0.1:{port}/x"}
        )
        error = await failed(server.url("/secure"))
        assert error.kind == "connection" and f"cannot connect to 127.0.0.1:{port}" in error.message

    served(lambda request: reply(), test)


# -- the pool ------------------------------------------------------------------------------------


def test_the_pool_size_bounds_calls_under_way() -> None:
    async def test(server: RawServer) -> None:
        results = await asyncio.gather(*(call(server.url()) for _ in range(7)))
        assert all(result.status == 200 for result in results)
        assert server.most_open <= 2 and server.connections >= 2

    exchange.configure_pool(2)
    try:
        served(lambda request: Answer(reply().pieces, pause=0.1), test)
    finally:
        exchange.configure_pool(200)


class _CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the host names it is asked to look up."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_up: list[str] = []

    async def getaddrinfo(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        self.looked_up.append(host)
        await asyncio.sleep(0.05)  # a resolver taking its time: the calls pile up on it
        return await super().getaddrinfo(host, *args, **kwargs)


def test_concurrent_calls_look_a_name_up_once_and_an_address_never() -> None:
    """A run's first calls start together: a host name is looked up once for all of
    them (not once each, through the loop's thread pool), an IP address not at all.
    Nor does a call cancelled while it waits cancel the lookup the others wait on."""

    async def test(server: RawServer) -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, _CountingLoop)
        port = server.url().split(":")[2].rstrip("/")
        by_address = await asyncio.gather(*(call(server.url()) for _ in range(20)))
        assert all(result.status == 200 for result in by_address)
        assert loop.looked_up == []
        by_name = f"http://localhost:{port}/"
        impatient = asyncio.ensure_future(call(by_name))
        waiting = [asyncio.ensure_future(call(by_name)) for _ in range(20)]
        await asyncio.sleep(0.01)
        impatient.cancel()
        by_name_results = await asyncio.gather(*waiting)
        assert all(result.status == 200 for result in by_name_results)
        assert loop.looked_up == ["localhost"]

    async def main() -> None:
        async with RawServer(lambda request: reply()) as server:
            await test(server)

    with asyncio.Runner(loop_factory=_CountingLoop) as runner:
        runner.run(main())
        runner.run(exchange.close_session())


# -- what a process imported (for other tests) ------------------------------------------------
