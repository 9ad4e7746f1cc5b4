"""What the provider stand-ins share: answers scripted per model, every request recorded,
and the aiohttp server on its own thread.

    with OpenAIChatStandIn() as api:
        api.script("gpt-test", Answer("Hello!"), Answer(tool_calls=(Call("lookup", {"q": 1}),)))
        api.script("judge", lambda body: Answer('{"passed": true}'))
        ... call api.base_url ...
        api.bodies("gpt-test")   # every accepted request body for that model, in order

A script is a list of answers used in order, or a function of the request body giving
one. A request the stand-in accepts but has nothing scripted for is answered with HTTP
500 and a message saying so (a test that sends an unexpected call sees it). A request the
stand-in refuses (an unknown field, a wrong type, a missing header) never reaches the
script; it is recorded all the same, with the refusal, so a test can look at both.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer


@dataclass(frozen=True)
class Call:
    """A tool call an answer makes: the tool's name and its arguments."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """What the model answers: text, tool calls, or both."""

    text: str | None = None
    tool_calls: Sequence[Call] = ()


Rule = Sequence["Answer | str"] | Callable[[dict[str, Any]], "Answer | str"]


class Refusal(Exception):
    """A request the provider refuses: the HTTP status and the provider's error body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(json.dumps(body))
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Received:
    """One request as it arrived, and the refusal it got (None: accepted)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: CIMultiDictProxy[str]
    raw: bytes
    at: float
    refusal: Refusal | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


FRAMING_KEYS = frozenset({"role", "type", "id", "tool_call_id", "tool_use_id"})


def count_tokens(text: str) -> int:
    """The stand-in's token count: words, so that usage is something a test can predict."""
    return len(text.split())


def text_tokens(value: Any) -> int:
    """Words in every string inside a request's messages (or anything JSON), but for the
    roles, types and ids that frame them."""
    if isinstance(value, str):
        return count_tokens(value)
    if isinstance(value, Mapping):
        return sum(text_tokens(v) for k, v in value.items() if k not in FRAMING_KEYS)
    if isinstance(value, list):
        return sum(text_tokens(v) for v in value)
    return 0


def json_type(value: Any) -> str:
    """A JSON value's type as the providers' error messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "decimal"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class ScriptedStandIn(ServedOnThread):
    """The recording and the scripts; a provider's stand-in adds its routes (`routes`)
    and raises `Refusal` for what the provider refuses."""

    name = "stand-in"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[Answer | str] | Callable[[dict[str, Any]], Answer | str]]
        self._scripts = {}
        self._received: list[Received] = []
        self._server = ThreadedServer(
            self._app, name=self.name, shutdown_timeout=0.5, handler_cancellation=True
        )

    def script(self, model: str, *answers: Answer | str | Callable[[dict[str, Any]], Any]) -> None:
        """Answers for `model` (the deployment, on Azure): in order, or one function."""
        with self._lock:
            if len(answers) == 1 and callable(answers[0]):
                self._scripts[model] = answers[0]
                return
            queue = self._scripts.get(model)
            if not isinstance(queue, deque):
                queue = self._scripts[model] = deque()
            queue.extend(a for a in answers if isinstance(a, Answer | str))

    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def accepted(self, model: str | None = None) -> list[Received]:
        """The requests that were not refused (for `model`: those naming it)."""
        return [
            r
            for r in self.received()
            if r.refusal is None and (model is None or self.model_of(r) == model)
        ]

    def bodies(self, model: str | None = None) -> list[dict[str, Any]]:
        return [r.json for r in self.accepted(model)]

    def refusals(self) -> list[Refusal]:
        return [r.refusal for r in self.received() if r.refusal is not None]

    def model_of(self, received: Received) -> str | None:
        """Which script a request is answered from: its `model`."""
        body = received.json
        return body.get("model") if isinstance(body, dict) else None

    def answer(self, model: str, body: dict[str, Any]) -> Answer:
        with self._lock:
            rule = self._scripts.get(model)
            if isinstance(rule, deque):
                given: Answer | str | None = rule.popleft() if rule else None
            else:
                given = rule(body) if rule is not None else None
        if given is None:
            raise Refusal(
                500, {"error": {"message": f"stand-in: nothing scripted for model {model!r}"}}
            )
        return Answer(given) if isinstance(given, str) else given

    async def record(self, request: web.Request) -> tuple[Received, bytes]:
        """The request recorded on arrival, and its raw body."""
        raw = await request.read()
        received = Received(
            request.method,
            request.path,
            dict(request.query),
            CIMultiDictProxy(CIMultiDict(request.headers)),
            raw,
            time.monotonic(),
        )
        with self._lock:
            self._received.append(received)
        return received, raw

    def refused(self, received: Received, refusal: Refusal) -> web.Response:
        """The refusal, answered and kept with the request it refused."""
        with self._lock:
            at = next(i for i, seen in enumerate(self._received) if seen is received)
            self._received[at] = replace(received, refusal=refusal)
        return web.json_response(refusal.body, status=refusal.status)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _app(self) -> web.Application:
        app = web.Application()
        self.routes(app)
        return app


async def write_events(request: web.Request, events: Sequence[bytes]) -> web.StreamResponse:
    """Server-Sent Events, as the providers send them: text/event-stream, chunked."""
    response = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()
