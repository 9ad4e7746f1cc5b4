"""Streaming and history-based agents for tests: real sockets, scripted wire formats.

    with StreamServer() as server:
        server.script("/v1/chat/completions", Stream(openai_chunks(["Hel", "lo"])))
        ...  # call the agent at server.url("/v1")

Each path has a queue of replies served in order: a `Stream` (pieces written one by one,
each after its delay, then the body ends as `end` says: `close` finishes it, `cut` drops
the connection in the middle of the chunked body, `hang` goes silent until the client
leaves) or a whole `Reply` (tests/agent_servers.py). Every request is kept, as
AgentServer keeps them, so tests count attempts at the server.

The builders write the providers' wire formats as their API references describe them:

- `openai_chunks`: Chat Completions `chat.completion.chunk` events (`data: {...}`), the
  first with the assistant role, content and tool-call pieces (a call's id, type and
  name in its first piece, its `arguments` in later ones, matched by `index`), the
  `finish_reason` chunk, a final chunk with empty `choices` and `usage` (what
  `stream_options.include_usage` asks for), then `data: [DONE]`.
- `anthropic_events`: Messages `event: NAME` / `data: {...}` pairs: `message_start`,
  per block `content_block_start`, `content_block_delta` (`text_delta`,
  `input_json_delta`), `content_block_stop`, a `ping`, `message_delta` (stop_reason,
  output usage), `message_stop`; `anthropic_message` is the whole (non-streamed) body
  and `anthropic_error` the error body `{"type": "error", "error": {type, message}}`.

`HistoryAgent` is a tdx-style agent: POST /chat takes an input and answers with an
acknowledgement only; GET /history?session=ID returns the session's chat history (each
input, then the events scripted for it: several assistant messages, tool calls and
results). The official `openai` and `anthropic` clients read these servers in the tests,
a check that the formats here are the real ones.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_servers import Received, Reply
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer


@dataclass(frozen=True)
class Piece:
    """One write to the wire, `delay` seconds after the previous one."""

    data: bytes
    delay: float = 0.0


@dataclass(frozen=True)
class Stream:
    pieces: Sequence[Piece | bytes]
    status: int = 200
    content_type: str = "text/event-stream"
    end: Literal["close", "cut", "hang"] = "close"
    headers: dict[str, str] = field(default_factory=dict)


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event: `data` as JSON (a str as it is), with its `event:` name."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def _chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stream",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test",
        "choices": choices,
        "usage": usage,
    }


def openai_chunks(
    content: Sequence[str] = (),
    *,
    tool_calls: Sequence[tuple[str, str, Sequence[str]]] = (),
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
    done: bool = True,
) -> list[bytes]:
    """A Chat Completions stream: `content` pieces, then each tool call (id, name, its
    argument pieces), the finish_reason chunk, the usage chunk, [DONE]."""
    out = [sse(_chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}]))]
    for piece in content:
        out.append(sse(_chunk([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])))
    for index, (call_id, name, pieces) in enumerate(tool_calls):
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        out.append(sse(_chunk([{"index": 0, "delta": {"tool_calls": [first]}}])))
        for piece in pieces:
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            out.append(sse(_chunk([{"index": 0, "delta": delta}])))
    reason = finish_reason or ("tool_calls" if tool_calls else "stop")
    out.append(sse(_chunk([{"index": 0, "delta": {}, "finish_reason": reason}])))
    if usage is not None:
        out.append(sse(_chunk([], usage)))
    if done:
        out.append(sse("[DONE]"))
    return out


def anthropic_message(
    text: str | None = "ok",
    *,
    tool_uses: Sequence[tuple[str, str, dict[str, Any]]] = (),
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text is not None else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_uses]
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 10, "output_tokens": 5},
    }


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"}


def anthropic_events(
    text: Sequence[str] = (),
    *,
    tool_uses: Sequence[tuple[str, str, Sequence[str]]] = (),
    stop_reason: str | None = None,
    input_tokens: int = 10,
    output_tokens: int = 5,
    stop: bool = True,
) -> list[bytes]:
    """A Messages stream: a text block of `text` pieces, then tool_use blocks (id, name,
    input JSON pieces), message_delta and message_stop (unless `stop` is False)."""
    message = anthropic_message(None, usage={"input_tokens": input_tokens, "output_tokens": 1})
    message["stop_reason"] = None
    out = [sse({"type": "message_start", "message": message}, "message_start")]
    index = 0
    if text:
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        out.append(sse(block, "content_block_start"))
        out.append(sse({"type": "ping"}, "ping"))
        for piece in text:
            delta = {"type": "text_delta", "text": piece}
            out.append(
                sse(
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                    "content_block_delta",
                )
            )
        out.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        index = 1
    for offset, (call_id, name, pieces) in enumerate(tool_uses):
        at = index + offset
        start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        out.append(
            sse(
                {"type": "content_block_start", "index": at, "content_block": start},
                "content_block_start",
            )
        )
        for piece in pieces:
            delta = {"type": "input_json_delta", "partial_json": piece}
            out.append(
                sse(
                    {"type": "content_block_delta", "index": at, "delta": delta},
                    "content_block_delta",
                )
            )
        out.append(sse({"type": "content_block_stop", "index": at}, "content_block_stop"))
    reason = stop_reason or ("tool_use" if tool_uses else "end_turn")
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    out.append(sse(delta, "message_delta"))
    if stop:
        out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


class StreamServer(ServedOnThread):
    """Scripted streams and whole replies per path, on 127.0.0.1, on its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Stream | Reply]] = defaultdict(deque)
        self._received: list[Received] = []
        self._server = ThreadedServer(
            self._app, name="stream-server", shutdown_timeout=0.5, handler_cancellation=True
        )

    def script(self, path: str, *replies: Stream | Reply) -> None:
        with self._lock:
            self._queues[path].extend(replies)

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r.json for r in self.requests(path)]

    def url(self, path: str = "") -> str:
        return self.base_url + path

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = CIMultiDictProxy(CIMultiDict(request.headers))
        with self._lock:
            self._received.append(
                Received(request.method, request.path, headers, body, time.monotonic())
            )
            queue = self._queues[request.path]
            reply = queue.popleft() if queue else None
        if reply is None:
            return web.json_response({"error": {"message": "nothing scripted"}}, status=404)
        if isinstance(reply, Reply):
            await asyncio.sleep(reply.delay)
            payload, content_type = reply.encode()
            out = CIMultiDict(reply.headers)
            if content_type is not None:
                out["Content-Type"] = content_type
            return web.Response(status=reply.status, body=payload, headers=out)
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        response.content_type = reply.content_type
        response.enable_chunked_encoding()
        await response.prepare(request)
        for piece in reply.pieces:
            item = piece if isinstance(piece, Piece) else Piece(piece)
            if item.delay:
                await asyncio.sleep(item.delay)
            await response.write(item.data)
        if reply.end == "hang":
            await asyncio.sleep(3600)  # cancelled when the client gives up
        if reply.end == "cut":
            # The chunked body never gets its last chunk: the client sees a broken body.
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app


class HistoryAgent(ServedOnThread):
    """A tdx-style agent: POST /chat {session_id, input} answers {"status": "accepted"};
    the reply is in GET /history?session=ID: {"messages": [user input, events...]}.

    `rounds` are the events emitted after each input, in order (one list per input).
    With `tdx`, the history is written as tdx's is: {"data": [{"input", "at"},
    {"content", "at"}, {"tool": {"functionName", "content"}, "at"}, ...]}, each event told
    apart by the key it carries (`rounds` are then written that way too).
    """

    def __init__(
        self,
        rounds: Sequence[Sequence[dict[str, Any]]],
        greeting: bool = True,
        tdx: bool = False,
    ) -> None:
        self._rounds = deque(rounds)
        self._greeting = greeting
        self._tdx = tdx
        self._clock = itertools.count()
        self._lock = threading.Lock()
        self.histories: dict[str, list[dict[str, Any]]] = {}
        self.received: list[tuple[str, str]] = []
        self._server = ThreadedServer(self._app, name="history-agent", shutdown_timeout=0.5)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        session = str(body.get("session_id"))
        with self._lock:
            self.received.append(("POST", request.path_qs))
            history = self.histories.setdefault(session, [])
            if not history and self._greeting:
                # Before the first input: belongs to no round.
                history.append(self._event({"role": "assistant", "content": "Welcome!"}))
            history.append(self._event({"role": "user", "content": body.get("input")}))
            history.extend(self._rounds.popleft() if self._rounds else [])
        return web.json_response({"status": "accepted"})

    def _event(self, message: dict[str, Any]) -> dict[str, Any]:
        if not self._tdx:
            return message
        at = f"2026-01-01T00:00:{next(self._clock):02d}Z"
        key = "input" if message["role"] == "user" else "content"
        return {key: message["content"], "at": at}

    async def _history(self, request: web.Request) -> web.Response:
        with self._lock:
            self.received.append(("GET", request.path_qs))
            messages = list(self.histories.get(request.query.get("session", ""), []))
        return web.json_response({"data" if self._tdx else "messages": messages})

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/chat", self._chat)
        app.router.add_get("/history", self._history)
        return app
