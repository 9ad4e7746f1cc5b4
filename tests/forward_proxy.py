"""A small forward proxy for tests, on real sockets, that keeps what passes through it.

    async with ForwardProxy(credentials=("user", "pw")) as proxy:   # http://127.0.0.1:PORT
        ...                                   # HTTP_PROXY=proxy.url, or an agent's proxy:
        assert [p.target for p in proxy.passed] == ["CONNECT 127.0.0.1:8443"]

It forwards absolute-URI requests (`POST http://host:port/path HTTP/1.1`, any method,
a body by Content-Length) to their server, with `Connection: close` and without the
Proxy-* headers, and relays the reply; and it tunnels `CONNECT host:port`, answering
200 and then copying bytes both ways. With `credentials`, a request without the right
`Proxy-Authorization: Basic ...` gets 407 and goes nowhere.

Written on asyncio's streams rather than an aiohttp server: a CONNECT tunnel takes over
the connection after the 200, which aiohttp's server offers a handler no public way to do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

_HOP_BY_HOP = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}


@dataclass(frozen=True)
class Passed:
    """One request the proxy received: `target` is "CONNECT host:port" or "METHOD url"."""

    target: str
    proxy_authorization: str | None
    allowed: bool


class ForwardProxy:
    def __init__(self, credentials: tuple[str, str] | None = None) -> None:
        self.credentials = credentials
        self.passed: list[Passed] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def targets(self) -> list[str]:
        return [p.target for p in self.passed]

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # (cancelled when the proxy closes)
        task.add_done_callback(self._tasks.discard)
        upstream: list[asyncio.StreamWriter] = []
        try:
            await self._serve(reader, writer, upstream)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            for each in (writer, *upstream):
                each.close()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: list[asyncio.StreamWriter],
    ) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        method, target, _version = request_line.split(" ", 2)
        headers = [
            (name.strip(), value.strip())
            for name, _, value in (line.partition(":") for line in header_lines if line)
        ]
        auth = next((v for n, v in headers if n.lower() == "proxy-authorization"), None)
        allowed = self._allowed(auth)
        self.passed.append(Passed(f"{method} {target}", auth, allowed))
        if not allowed:
            body = b"proxy authentication required"
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="test"\r\n'
                b"Content-Type: text/plain\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            upstream.append(up_writer)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            return
        url = urlsplit(target)
        length = next((int(v) for n, v in headers if n.lower() == "content-length"), 0)
        body = await reader.readexactly(length) if length else b""
        assert url.hostname is not None
        up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
        upstream.append(up_writer)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        forwarded = "".join(f"{n}: {v}\r\n" for n, v in headers if n.lower() not in _HOP_BY_HOP)
        up_writer.write(
            f"{method} {path} HTTP/1.1\r\n{forwarded}Connection: close\r\n\r\n".encode("latin-1")
            + body
        )
        await up_writer.drain()
        await _copy(up_reader, writer)

    def _allowed(self, auth: str | None) -> bool:
        if self.credentials is None:
            return True
        expected = base64.b64encode(":".join(self.credentials).encode()).decode()
        return auth == f"Basic {expected}"


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            sink.write_eof()
