"""One kept-alive HTTP/1.1 connection to an agent: it writes a request and reads its
reply into a future (plain_http.py's client keeps these per host).

A reply is read by its length, chunked, or to the connection's close, 1xx replies
skipped, gzip and deflate undone; a head over 64 KB or any line it cannot read fails the
call, and the connection is never used again. A request's header values with control
characters are refused (as aiohttp does: no header smuggled in).
"""

from __future__ import annotations

import asyncio
import re
import socket
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yarl import URL

USER_AGENT = "agenttest"
ACCEPT_ENCODING = "gzip, deflate"
MAX_HEAD_BYTES = 64 * 1024
_READ_SIZE = 64 * 1024
_MAX_LINE = 8 * 1024

# What an idle connection holds instead of a buffer, a body and headers of its own (a
# connection in flight waits with them empty: 180 bytes each, at thousands in flight).
# Never written to: a reply's head gives it its own (`_read_head`, `data_received`).
_NOTHING = bytearray()
_NO_HEADERS: dict[str, str] = {}

# Body modes of a reply.
_NONE, _LENGTH, _CHUNKED, _TO_CLOSE = range(4)
# Where a chunked body is, when not inside a chunk's data.
_SIZE_LINE, _CHUNK_END, _TRAILER = -1, -2, -3


class HttpFailure(Exception):
    """A call that got no reply it could read, in words (transport.py: "cannot reach").
    `retryable`: the connection dropped before any reply came (an idempotent request
    is sent once more)."""

    retryable = False


class ConnectFailure(Exception):
    """Could not connect: `reason` in words (breaker.connect_reason), which the breaker
    keeps as why the agent is unreachable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class PlainReply:
    status: int
    headers: dict[str, str]
    body: bytes


# As aiohttp (http_writer._safe_header): a header may not smuggle another in.
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_header(text: str) -> str:
    if _FORBIDDEN.search(text) is not None:
        raise ValueError(
            "Forbidden control character detected in headers. Potential header injection attack."
        )
    return text


@dataclass(frozen=True, slots=True)
class Target:
    """A URL as a request needs it, parsed once per URL (plain_http.target)."""

    url: URL
    host: str  # to connect to
    port: int
    host_header: str
    path: str  # the request target: path and query, quoted


def request_head(method: str, target: Target, headers: dict[str, str], length: int | None) -> bytes:
    given = {name.lower() for name in headers}
    lines = [f"{_check_header(method)} {target.path} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {target.host_header}")
    lines.extend(f"{_check_header(k)}: {_check_header(v)}" for k, v in headers.items())
    if "accept" not in given:
        lines.append("Accept: */*")
    if "accept-encoding" not in given:
        lines.append(f"Accept-Encoding: {ACCEPT_ENCODING}")
    if "user-agent" not in given:
        lines.append(f"User-Agent: {USER_AGENT}")
    if length is not None and "content-length" not in given:
        lines.append(f"Content-Length: {length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8")


class Connection:
    """One kept-alive connection, reading one reply at a time into its future.

    It owns its socket and watches it only while a reply is awaited (the event loop's
    `add_reader`), not through an asyncio transport: a transport and its bookkeeping
    hold ~0.9 KB a connection, one connection per call in flight. An idle connection
    is not watched; whether its agent closed it is looked at when it is taken again
    (`usable`)."""

    __slots__ = (
        "_body",
        "_buffer",
        "_close_after",
        "_headers",
        "_left",
        "_limit",
        "_loop",
        "_mode",
        "_no_body",
        "_reading",
        "_status",
        "_unsent",
        "_waiter",
        "closed",
        "idle_since",
        "key",
        "sock",
    )  # fmt: skip

    def __init__(
        self, key: tuple[str, int], sock: socket.socket, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.key = key
        self.sock = sock
        self._loop = loop
        self.idle_since = 0.0
        self.closed = False
        self._reading = False
        self._unsent: memoryview | None = None
        self._waiter: asyncio.Future[PlainReply] | None = None
        self._buffer = _NOTHING
        self._limit = 0
        self._no_body = False
        self._reset()

    def _reset(self) -> None:
        self._status = 0  # 0: the head has not been read yet
        self._headers = _NO_HEADERS
        self._close_after = False
        self._mode = _NONE
        self._left = 0
        self._body = _NOTHING

    def usable(self) -> bool:
        """Whether an idle connection can carry a request: not closed by its agent, and
        with nothing unasked for waiting on it."""
        if self.closed:
            return False
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True  # nothing to read: open and quiet
        except OSError:
            pass
        return False  # closed by its agent (b""), or bytes nobody asked for

    # -- a request -------------------------------------------------------------------------

    def send(
        self, head: bytes, body: bytes | None, limit: int, no_body: bool
    ) -> asyncio.Future[PlainReply]:
        self._waiter = waiter = self._loop.create_future()
        self._limit = limit
        self._no_body = no_body
        data = head + body if body else head
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._ended(exc)
            return waiter
        if sent < len(data):  # the rest when the socket can take it
            self._unsent = memoryview(data)[sent:]
            self._loop.add_writer(self.sock.fileno(), self._writable)
        self._reading = True
        self._loop.add_reader(self.sock.fileno(), self._readable)
        return waiter

    def time_out(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(TimeoutError())
        self.close()

    def close(self) -> None:
        self._unwatch()
        self.closed = True
        self._waiter = None
        self.sock.close()

    abort = close

    def _unwatch(self) -> None:
        # Before the socket is closed: the loop's selector would otherwise keep a closed
        # descriptor, which the next socket given the same number would trip over.
        if self.sock.fileno() < 0:
            return
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self.sock.fileno())
        if self._unsent is not None:
            self._unsent = None
            self._loop.remove_writer(self.sock.fileno())

    def _writable(self) -> None:
        unsent = self._unsent
        if unsent is None:
            return
        try:
            sent = self.sock.send(unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._ended(exc)
            return
        if sent < len(unsent):
            self._unsent = unsent[sent:]
        else:
            self._unsent = None
            self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            data = self.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._ended(exc)
            return
        if not data:
            self._ended(None)
            return
        if self._buffer is _NOTHING:
            self._buffer = bytearray(data)
        else:
            self._buffer += data
        try:
            self._advance()
        except HttpFailure as exc:
            self._fail(exc)

    # -- reading a reply -------------------------------------------------------------------

    def _ended(self, exc: Exception | None) -> None:
        """The agent closed the connection (`exc` None) or it broke, mid-reply."""
        if self._waiter is None:
            self.close()
            return
        if exc is None and self._status and self._mode == _TO_CLOSE:
            self._finish()
        elif exc is not None and not isinstance(exc, ConnectionResetError | BrokenPipeError):
            self._fail(HttpFailure(str(exc) or type(exc).__name__))
        elif exc is not None:
            self._fail(HttpFailure(str(exc)), retryable=True)
        elif self._status:
            self._fail(HttpFailure("Response payload is not completed"))
        else:
            self._fail(HttpFailure("Server disconnected"), retryable=True)

    def _fail(self, exc: HttpFailure, retryable: bool = False) -> None:
        waiter = self._waiter
        exc.retryable = retryable and not self._status
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _advance(self) -> None:
        buffer = self._buffer
        while True:
            if not self._status:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise HttpFailure(f"reply headers over {MAX_HEAD_BYTES >> 10} KB")
                    return
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                if not self._read_head(head):
                    continue  # an informational (1xx) reply: the real one follows
                if self._mode == _NONE:
                    self._finish()
                    return
            if self._mode == _CHUNKED:
                if not self._chunks():
                    return
                self._finish()
                return
            self._body += buffer
            buffer.clear()
            if self._mode == _LENGTH and len(self._body) >= self._left:
                if len(self._body) > self._left:  # more than it announced
                    del self._body[self._left :]
                    self._close_after = True
                self._finish()
                return
            if len(self._body) > self._limit:
                self._close_after = True  # the rest is never read
                self._finish()
            return

    def _read_head(self, head: bytes) -> bool:
        """The status line and headers; False for an informational reply."""
        lines = head.decode("utf-8", "surrogateescape").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0"):
            raise HttpFailure(f"invalid reply: status line {lines[0][:100]!r}")
        if len(parts[1]) != 3 or not parts[1].isdigit():
            raise HttpFailure(f"invalid reply: status {parts[1][:20]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip() or len(line) > _MAX_LINE:
                raise HttpFailure(f"invalid reply: header line {line[:100]!r}")
            headers[name] = value.strip(" \t")
        if 100 <= status < 200:
            if status == 101:
                raise HttpFailure("invalid reply: 101 Switching Protocols to a plain request")
            return False
        self._status = status
        self._headers = headers
        self._body = bytearray()
        found = {name.lower(): value for name, value in headers.items()}
        connection = found.get("connection", "").lower()
        if parts[0] == "HTTP/1.0":
            self._close_after = "keep-alive" not in connection
        else:
            self._close_after = "close" in connection
        coding = found.get("transfer-encoding", "").lower()
        length = found.get("content-length")
        if self._no_body or status in (204, 304):
            self._mode = _NONE
        elif coding:
            if coding.rsplit(",", 1)[-1].strip() != "chunked":
                raise HttpFailure(f"invalid reply: Transfer-Encoding {coding[:50]!r}")
            self._mode, self._left = _CHUNKED, _SIZE_LINE
        elif length is not None:
            if not length.strip().isdigit():
                raise HttpFailure(f"invalid reply: Content-Length {length[:50]!r}")
            self._mode, self._left = _LENGTH, int(length)
            if not self._left:
                self._mode = _NONE
        else:
            self._mode, self._close_after = _TO_CLOSE, True
        return True

    def _chunks(self) -> bool:
        """Read chunked data from the buffer; True once the last chunk and trailers are in."""
        buffer = self._buffer
        while buffer:
            if self._left > 0:
                piece = buffer[: self._left]
                del buffer[: len(piece)]
                self._body += piece
                self._left -= len(piece)
                if len(self._body) > self._limit:
                    self._close_after = True
                    return True
                if not self._left:
                    self._left = _CHUNK_END
                continue
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > _MAX_LINE:
                    raise HttpFailure("invalid reply: chunk line too long")
                return False
            line = bytes(buffer[:end])
            del buffer[: end + 2]
            if self._left == _CHUNK_END:
                if line:
                    raise HttpFailure("invalid reply: chunk longer than its size")
                self._left = _SIZE_LINE
            elif self._left == _SIZE_LINE:
                size = line.split(b";", 1)[0].strip()
                try:
                    self._left = int(size, 16)
                except ValueError:
                    raise HttpFailure(f"invalid reply: chunk size {size[:20]!r}") from None
                if self._left < 0:
                    raise HttpFailure(f"invalid reply: chunk size {size[:20]!r}")
                if not self._left:
                    self._left = _TRAILER
            elif not line:  # the empty line after the trailers
                return True
        return False

    def _finish(self) -> None:
        waiter = self._waiter
        try:
            body = _decoded(self._body, self._headers, self._limit)
        except HttpFailure as exc:
            self._fail(exc)
            return
        reply = PlainReply(self._status, self._headers, body)
        close = self._close_after or bool(self._buffer)
        self._waiter = None
        self._buffer = _NOTHING
        self._reset()
        if close:
            self.close()
        else:
            self._unwatch()
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)


def header(headers: dict[str, str], name: str) -> str | None:
    """A reply's header by name in any case (the last of its kind)."""
    found = headers.get(name)
    if found is None:
        wanted = name.lower()
        for key, value in headers.items():
            if key.lower() == wanted:
                found = value
    return found


def _decoded(body: bytearray, headers: dict[str, str], limit: int) -> bytes:
    """The body with its Content-Encoding undone (gzip, deflate), at most `limit` bytes
    (more would be an over-long reply, which the caller refuses)."""
    coding = (header(headers, "Content-Encoding") or "").strip().lower()
    if coding not in ("gzip", "deflate", "x-gzip"):
        return bytes(body)
    attempts = (16 + zlib.MAX_WBITS,) if coding != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for wbits in attempts:  # deflate comes with or without its zlib header
        try:
            return zlib.decompressobj(wbits).decompress(bytes(body), limit + 1)
        except zlib.error:
            continue
    raise HttpFailure(f"Can not decode content-encoding: {coding}")
