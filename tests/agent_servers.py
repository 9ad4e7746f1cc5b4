"""A scriptable HTTP agent for tests: real sockets, scripted replies, every request kept.

    with AgentServer() as server:
        server.script("/v1/chat/completions", Reply(429, headers={"Retry-After": "1"}),
                      Reply(body=completion("hi")))
        ...  # call the agent at server.url("/v1")
        assert len(server.requests("/v1/chat/completions")) == 2

Each path has a queue of replies (status, headers, body, delay), served in order; once
the queue is empty, the path's `always` reply is served, else a 404 saying that nothing
was scripted (not retryable, so a stray extra attempt shows up as one extra request and a
clear error). Every request is recorded on arrival (method, path, headers, body, time on
the `time.monotonic` clock) before its reply's delay, so tests can assert what was sent,
how many attempts happened and how far apart they came.

The server runs on a background thread with its own event loop, so the code under test
can use `asyncio.run` in the test's thread. Handlers are cancelled when the client goes
away (a timed-out call), so a long `delay` does not hold up `stop()`.

A path may instead answer each request with a function of it (`respond`): see
`FickleJudges`, judges that disagree with themselves and with each other.

Also here: `run(coro)` runs client code in a fresh event loop and closes that loop's
shared aiohttp session; `completion()` and `tool_call()` build Chat Completions bodies;
`refused_url()` is an address where nothing listens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from agenttest_worker.agents.http.exchange import close_session
from agenttest_worker.demo._protocol import metadata_of
from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer

START_TIMEOUT_S = 10.0
SHUTDOWN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Reply:
    """One scripted response. `body`: dict or list → JSON, str → text, bytes → as is."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # Default: application/json for dict/list bodies, text/plain for str, none for bytes.
    content_type: str | None = None

    def encode(self) -> tuple[bytes, str | None]:
        if isinstance(self.body, bytes):
            return self.body, self.content_type
        if isinstance(self.body, str):
            return self.body.encode(), self.content_type or "text/plain; charset=utf-8"
        if self.body is None:
            return b"", self.content_type
        return json.dumps(self.body).encode(), self.content_type or "application/json"


@dataclass(frozen=True)
class Received:
    """One request as it arrived."""

    method: str
    path: str
    headers: CIMultiDictProxy[str]
    body: bytes
    at: float  # time.monotonic() on arrival

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def completion(
    content: Any = "ok",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    message_extra: Mapping[str, Any] | None = None,
    **top_level: Any,
) -> dict[str, Any]:
    """A chat.completion body; `message_extra` adds fields to the message, `top_level` to
    the body (e.g. awaiting_input=True)."""
    message: dict[str, Any] = {"role": "assistant", "content": content, **(message_extra or {})}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "test",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        **top_level,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def tool_call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    """A Chat Completions tool call; dict arguments are JSON-encoded as the protocol says."""
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}}


def refused_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class AgentServer(ServedOnThread):
    """Scripted replies per path on 127.0.0.1 (port 0: a free port), on its own thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Reply]] = defaultdict(deque)
        self._always: dict[str, Reply] = {}
        self._responders: dict[str, Callable[[Received], Reply]] = {}
        self._received: list[Received] = []
        self._server = ThreadedServer(
            self._app,
            host=host,
            port=port,
            name="agent-server",
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            handler_cancellation=True,
            start_timeout=START_TIMEOUT_S,
        )

    # -- scripting and inspection (any thread) -----------------------------------------

    def script(self, path: str, *replies: Reply) -> None:
        """Queue `replies` for `path`, served in order, one per request."""
        with self._lock:
            self._queues[path].extend(replies)

    def always(self, path: str, reply: Reply) -> None:
        """Serve `reply` for `path` whenever its queue is empty."""
        with self._lock:
            self._always[path] = reply

    def respond(self, path: str, responder: Callable[[Received], Reply]) -> None:
        """Answer each request to `path` whose queue is empty with `responder(request)`
        (called on the server's thread, one request at a time)."""
        with self._lock:
            self._responders[path] = responder

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    def bodies(self, path: str | None = None) -> list[Any]:
        """The JSON bodies of the requests to `path`, in order."""
        return [r.json for r in self.requests(path)]

    def gaps(self, path: str | None = None) -> list[float]:
        """Seconds between consecutive arrivals at `path`."""
        times = [r.at for r in self.requests(path)]
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    def pending(self, path: str) -> int:
        """Scripted replies not served yet."""
        with self._lock:
            return len(self._queues[path])

    def url(self, path: str = "") -> str:
        return self.base_url + path

    # -- serving (the server's thread) ----------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        body = await request.read()
        received = Received(
            request.method,
            request.path,
            CIMultiDictProxy(CIMultiDict(request.headers)),
            body,
            arrived,
        )
        with self._lock:
            self._received.append(received)
            queue = self._queues[request.path]
            reply: Reply | None
            if queue:
                reply = queue.popleft()
            elif (responder := self._responders.get(request.path)) is not None:
                reply = responder(received)
            else:
                reply = self._always.get(request.path)
        if reply is None:
            return web.json_response(
                {"error": {"message": f"no scripted reply for {request.method} {request.path}"}},
                status=404,
            )
        if reply.delay:
            await asyncio.sleep(reply.delay)
        payload, content_type = reply.encode()
        headers = CIMultiDict(reply.headers)
        if content_type is not None:
            headers["Content-Type"] = content_type
        return web.Response(status=reply.status, body=payload, headers=headers)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app


class FickleJudges:
    """Judge models behind one Chat Completions path (`model` names the judge) that vote
    as the criteria they are given say, so that a test case scripts how its judges
    disagree:

        criteria: 'Be polite. a=pass:0.9,fail:0.2,pass b=fail,error'

    Judge `a` answers an assertion's asks with pass (score 0.9), fail (0.2), pass, and
    round again; `b` fails, then answers HTTP 500 (a failed call: the agent entry should
    not retry). `pass` without `:score` sends no score. A judge the criteria do not name
    passes with score 1. The asks of one assertion are told apart from other cases' by
    `metadata.test_id` and the criteria, so concurrent cases each get their own turn
    through the list however their asks interleave, and N asks of a list of N votes
    give exactly those votes in some order. Requests that are not a judge's (no
    `test_mode: validator`) are the target's: it answers `target_reply`. Every answer
    carries usage (10 prompt + 5 completion tokens), so budgets see each call.
    """

    USAGE: ClassVar[dict[str, int]] = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
    }
    # "name=vote,vote,...", a vote being pass, fail or error, and an optional ":score".
    _VOTE = r"(?:pass|fail|error)(?::[\d.]+)?"
    _SCRIPT = re.compile(rf"(?<![\w.-])([\w.-]+)=({_VOTE}(?:,{_VOTE})*)")

    def __init__(self, target_reply: str = "Hello there.", delay: float = 0.0) -> None:
        self.target_reply = target_reply
        self.delay = delay
        self._turns: Counter[tuple[str, str, str]] = Counter()
        self.asked: Counter[str] = Counter()  # judge model -> requests
        self.targeted = 0  # requests that were the target's

    def __call__(self, request: Received) -> Reply:
        body = request.json
        model = str(body.get("model"))
        # Where a chat model behind a hosted API reads it: the role prompt.
        metadata = metadata_of(body)
        if metadata.get("test_mode") != "validator":
            self.targeted += 1
            return Reply(body=completion(self.target_reply, usage=self.USAGE), delay=self.delay)
        self.asked[model] += 1
        criteria = str(metadata.get("criteria", ""))
        key = (model, str(metadata.get("test_id")), criteria)
        votes = dict(self._SCRIPT.findall(criteria)).get(model, "pass:1").split(",")
        index = self._turns[key]
        self._turns[key] += 1
        verdict, _, score = votes[index % len(votes)].partition(":")
        if verdict == "error":
            return Reply(500, {"error": {"message": f"{model} is down"}}, delay=self.delay)
        answer: dict[str, Any] = {"passed": verdict == "pass", "reason": f"{model} says {verdict}"}
        if score:
            answer["score"] = float(score)
        return Reply(body=completion(json.dumps(answer), usage=self.USAGE), delay=self.delay)


T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    """Run `coro` in a fresh event loop and close that loop's shared aiohttp session."""

    async def main() -> T:
        try:
            return await coro
        finally:
            await close_session()

    return asyncio.run(main())


class ExpenseSystem(ServedOnThread):
    """An http agent with a system behind it, for end state tests: POST /chat
    {session_id, input} answers {"content"} and keeps one expense per session, a draft
    until the user says "submit"; GET or POST /state/SESSION serves it as
    {"data": {"expense": {...}, "token": X-State-Token}} (a header it was sent, echoed).

    `submits=False` is the agent built to fail: it says the expense is submitted and
    leaves it a draft. `state_status` other than 200 makes the state URL answer that
    status. Every request to the state URL is kept (`state_requests`: method, path,
    headers, body).
    """

    def __init__(self, submits: bool = True, state_status: int = 200, note: str = "") -> None:
        self.submits = submits
        self.note = note
        self.state_status = state_status
        self._lock = threading.Lock()
        self.expenses: dict[str, dict[str, Any]] = {}
        self.state_requests: list[Received] = []
        self._server = ThreadedServer(self._app, name="expense-system", shutdown_timeout=0.5)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        session, text = str(body.get("session_id")), str(body.get("input") or "")
        with self._lock:
            expense = self.expenses.setdefault(
                session, {"status": "draft", "amount": 42, "note": self.note}
            )
            if "submit" in text.lower():
                if self.submits:
                    expense["status"] = "submitted"
                return web.json_response({"content": "Your expense is submitted."})
        return web.json_response({"content": f"Draft expense of {expense['amount']} EUR."})

    async def _state(self, request: web.Request) -> web.Response:
        raw = await request.read()
        with self._lock:
            self.state_requests.append(
                Received(request.method, request.path, request.headers, raw, time.monotonic())
            )
            if self.state_status != 200:
                return web.json_response({"error": "state store down"}, status=self.state_status)
            expense = dict(self.expenses.get(request.match_info["session"], {}))
        token = request.headers.get("X-State-Token")
        return web.json_response({"data": {"expense": expense, "token": token}})

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/chat", self._chat)
        app.router.add_get("/state/{session}", self._state)
        app.router.add_post("/state/{session}", self._state)
        return app

    def entry(self, **state: Any) -> dict[str, Any]:
        """Its agenttest.yaml entry, with `state:` fields over the default
        (GET /state/{{session_id}}, read at $.data)."""
        return {
            "protocol": "http",
            "url": self.base_url + "/chat",
            "request": {"session_id": "{{session_id}}", "input": "{{input}}"},
            "timeout": 5,
            "max_retries": 0,
            "state": {
                "url": self.base_url + "/state/{{session_id}}",
                "response": "$.data",
                **state,
            },
        }
