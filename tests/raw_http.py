"""An HTTP server written by hand on a real socket, for the client's wire tests.

    async with RawServer(answer) as server:      # on the test's own event loop
        ...server.url("/chat")...
        server.requests, server.connections

`answer(request)` gives the bytes to send back, as pieces written one at a time with a
pause between them (so that the client reads them in separate chunks), and whether to
close the connection afterwards; None: never answer (the client must time out or give
up). A test can so send what no well-behaved server would: a reply cut short, a broken
status line, chunks split across reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self


@dataclass
class RawRequest:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    connection: int  # which connection it came on, from 1

    def header(self, name: str) -> str | None:
        found = [value for key, value in self.headers if key.lower() == name.lower()]
        return found[-1] if found else None


@dataclass
class Answer:
    pieces: list[bytes]
    close: bool = False
    pause: float = 0.01


def reply(
    status: int = 200,
    body: bytes = b'{"ok": true}',
    headers: dict[str, str] | None = None,
    close: bool = False,
) -> Answer:
    """A well-formed reply with a Content-Length."""
    fields = {
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        **(headers or {}),
    }
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return Answer([head.encode() + b"\r\n" + body], close=close)


@dataclass
class RawServer:
    answer: Callable[[RawRequest], Answer | None]
    requests: list[RawRequest] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def url(self, path: str = "/") -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}{path}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        number = self.connections
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = [
                    (name, value.strip())
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                ]
                request = RawRequest(method, target, headers, b"", number)
                length = int(request.header("Content-Length") or 0)
                request.body = await reader.readexactly(length) if length else b""
                self.requests.append(request)
                answer = self.answer(request)
                if answer is None:
                    await reader.read()  # until the client gives up
                    return
                for piece in answer.pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(answer.pause)
                if answer.close:
                    return
        except asyncio.CancelledError:
            return  # the test is over (returned, not raised: asyncio would log it)
        finally:
            self.open_now -= 1
            self._tasks.discard(task)
            writer.close()


class ThreadedRawServer:
    """A RawServer on a thread of its own with its own event loop, for a client that is
    not on the test's loop (an embedded run, a fleet's workers).

        with ThreadedRawServer(answer) as server:
            ...server.url("/v1")...
    """

    def __init__(self, answer: Callable[[RawRequest], Answer | None]) -> None:
        self.server = RawServer(answer)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def url(self, path: str = "/") -> str:
        return self.server.url(path)

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.__aenter__(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.__aexit__(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
