"""Streamed replies: framing (Server-Sent Events, NDJSON) and the assembler protocol.

A streaming protocol gives the transport an `Assembler` per attempt; the transport reads
the response body as events and feeds them to it. The assembler turns the events into
one AgentReply (text deltas joined, tool-call deltas put together) and notes when the
first piece of content came: from then on a failed stream is not retried (the agent
has begun to answer; a second attempt would be another answer), and what arrived is
kept on the error (`AgentError.partial`).

SSE follows the WHATWG event-stream rules the providers use: `field: value` lines, an
event dispatched at a blank line, `data` lines of one event joined with newlines, lines
starting with `:` are comments (keep-alives). Lines end in LF or CRLF.

A hostile agent may send anything: every read here is bounded (the whole stream, each
of its lines, each field an assembler puts together: `FieldBound`) and linear in what
arrived (text that comes in pieces is kept as a list of pieces and joined once,
`TextPieces`; a line is looked for only in the bytes that just came), so that one
agent's stream cannot hold the event loop every other conversation is played on.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agenttest_worker.agents.interface import AgentReply
from agenttest_worker.json_values import nested_deeper_than, too_deep_message

Framing = Literal["sse", "ndjson"]

# A whole stream may be this large: as large as a whole reply (exchange.MAX_BODY_BYTES).
MAX_STREAM_BYTES = 16 * 1024 * 1024
# One line of it (one SSE `data:` line, one NDJSON event): room for a base64 image in
# one event, and half the stream.
MAX_LINE_BYTES = 8 * 1024 * 1024
# A tool call's name is an identifier (the hosted APIs refuse names over 64 characters);
# this leaves room for any agent's naming and none for a reply hidden in it.
MAX_TOOL_NAME_CHARS = 1024


@dataclass(frozen=True)
class FieldBound:
    """How long one field of a streamed reply may grow, and the words that name it."""

    limit: int  # characters
    name: str

    def size(self) -> str:
        return f"{self.limit >> 20} MB" if self.limit >= 1 << 20 else f"{self.limit:,} characters"


# A reply's text and a tool call's arguments: as long as a whole reply may be.
REPLY_SIZE = FieldBound(MAX_STREAM_BYTES, "the reply-size bound")
TOOL_NAME = FieldBound(MAX_TOOL_NAME_CHARS, "the bound on a tool call's name")


@dataclass(frozen=True)
class StreamEvent:
    """One event: its SSE `event:` name (None for NDJSON and unnamed events), its data."""

    name: str | None
    data: str


class StreamFailure(Exception):
    """The stream said something that ends it badly: garbage, an error event, an end
    before its last event. `retryable`: worth another attempt if no content came yet
    (an overloaded agent's error event, a stream closed before it began)."""

    def __init__(self, message: str, *, retryable: bool = False, raw: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.raw = raw


def over_bound(what: str, bound: FieldBound) -> StreamFailure:
    """The failure of a stream whose field `what` ("gpt's tool call 0's name") grew past
    `bound`: the message names the bound."""
    return StreamFailure(f"agent error: {what} is over {bound.size()} ({bound.name})")


class TextPieces:
    """Text a stream sends in pieces (a reply's content, a tool call's name or arguments),
    kept as its pieces and joined once when read: a str grown piece by piece is copied
    whole at each piece, quadratic in its length. Bounded: a piece that takes it past
    `bound` fails the stream, naming the bound."""

    __slots__ = ("bound", "length", "parts", "what")

    def __init__(self, what: str, bound: FieldBound = REPLY_SIZE) -> None:
        self.what = what
        self.bound = bound
        self.length = 0
        self.parts: list[str] = []

    def add(self, piece: str) -> None:
        self.length += len(piece)
        if self.length > self.bound.limit:
            raise over_bound(self.what, self.bound)
        self.parts.append(piece)

    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def __bool__(self) -> bool:
        return self.length > 0


@dataclass(frozen=True)
class StreamSpec:
    """How to read a streamed reply: its framing, and a fresh assembler per attempt."""

    framing: Framing
    assembler: Callable[[], Assembler]


class Assembler(Protocol):
    """Puts one streamed reply together from its events."""

    # When the first piece of content arrived (time.monotonic()); None until then.
    first_token_at: float | None

    def feed(self, event: StreamEvent) -> bool:
        """Take one event; True when it was the last (the reply is complete).
        Raises StreamFailure for garbage or an error event."""
        ...

    def finish(self) -> None:
        """The body ended: raise StreamFailure if the reply is not complete."""
        ...

    def reply(self) -> AgentReply:
        """The reply as assembled so far (the whole of it once the stream completed)."""
        ...


def mark_content(assembler: Assembler) -> None:
    """Note that content has arrived (the first time only)."""
    if assembler.first_token_at is None:
        assembler.first_token_at = time.monotonic()


def json_data(event: StreamEvent, agent: str) -> Any:
    """An event's data as JSON; anything else is garbage that fails the stream."""
    try:
        data = json.loads(event.data)
    except RecursionError:  # nested past the parser's own limit
        data = None
        too_deep = True
    except ValueError:
        shown = event.data if len(event.data) <= 200 else event.data[:200] + "…"
        raise StreamFailure(
            f"agent error: {agent} sent a stream event that is not JSON: "
            f"{json.dumps(shown, ensure_ascii=False)}",
            raw=event.data[:4096],
        ) from None
    else:
        too_deep = nested_deeper_than(data, text=event.data)
    if too_deep:
        # Deeper than the project stores (json_values.MAX_REPLY_DEPTH): the turn fails.
        raise StreamFailure(
            f"agent error: {agent} sent a stream event {too_deep_message('with JSON')}",
            raw=event.data[:4096],
        )
    return data


def _long_line() -> StreamFailure:
    return StreamFailure(
        f"agent error: a line of the stream is over {MAX_LINE_BYTES >> 20} MB "
        "(the bound on a stream's line)"
    )


def _line(pending: list[bytes], end: bytes) -> str:
    """A line: the pieces of it that came before, and its end."""
    whole = b"".join((*pending, end)) if pending else end
    pending.clear()
    return whole.removesuffix(b"\r").decode("utf-8", errors="replace")


async def _lines(content: Any) -> AsyncGenerator[str, None]:
    """The body's lines (LF or CRLF), decoded as UTF-8, as they arrive.

    Read in chunks and split here rather than with aiohttp's readline, whose line limit
    (64 KB) a single event holding an image exceeds. A line still open is kept as the
    chunks it came in, and the end of a line looked for only in each new chunk: the
    work is linear in the body, however long its lines.
    """
    pending: list[bytes] = []  # the line begun, as its chunks
    pending_size = 0
    total = 0
    while True:
        chunk = await content.readany()
        if not chunk:
            break
        total += len(chunk)
        if total > MAX_STREAM_BYTES:
            raise StreamFailure(
                f"agent error: stream over {MAX_STREAM_BYTES >> 20} MB "
                "(the bound on a stream's size)"
            )
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if pending_size + end - start > MAX_LINE_BYTES:
                raise _long_line()
            yield _line(pending, chunk[start:end])
            pending_size = 0
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:] if start else chunk)
            pending_size += len(chunk) - start
            if pending_size > MAX_LINE_BYTES:
                raise _long_line()
    if pending:
        yield _line(pending, b"")


async def sse_events(content: Any) -> AsyncGenerator[StreamEvent, None]:
    name: str | None = None
    data: list[str] = []
    async for line in _lines(content):
        if not line:
            if data:
                yield StreamEvent(name, "\n".join(data))
            name, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    # An event not closed by a blank line is dropped, as the SSE rules say: the body
    # ended in the middle of it.


async def ndjson_events(content: Any) -> AsyncGenerator[StreamEvent, None]:
    async for line in _lines(content):
        if line.strip():
            yield StreamEvent(None, line)


async def read_stream(content: Any, framing: Framing, assembler: Assembler) -> None:
    """Feed the body's events to `assembler` until its last event or the body's end."""
    events = sse_events(content) if framing == "sse" else ndjson_events(content)
    # Closed at once when the last event comes before the body's end.
    async with aclosing(events):
        async for event in events:
            if assembler.feed(event):
                return
    assembler.finish()


def elapsed_ms(since: float, at: float | None) -> int | None:
    return None if at is None else max(0, int((at - since) * 1000))
