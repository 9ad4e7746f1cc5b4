"""HTTP server for the demo agents: the OpenAI Chat Completions protocol, under /v1.

    POST /v1/chat/completions   {"model", "messages", "metadata"?, "tools"?, "stream"?}
    GET  /v1/models             the models below, OpenAI list format

`model` picks the agent: "expense", "user-sim", "validator", "generator", "echo", "coin" (see each
module's docstring). `stream` is ignored: answers are never streamed. Errors use OpenAI's
shape {"error": {"message", "type"}}:

    400 invalid_request_error   body is not a JSON object, `model` is not a string,
                                `messages` is not a list of objects, `metadata` is not an
                                object, or a bad X-Demo-Delay-Ms header
    404 invalid_request_error   unknown model
    500 server_error            a demo agent raised (a bug in the demo)

The optional request header `X-Demo-Delay-Ms: <n>` makes the server wait n milliseconds
before answering (timeout and concurrency tests).

`create_app()` builds the aiohttp application; `DemoServer` runs it on a background
thread with its own event loop, for tests and scripts:

    with DemoServer() as server:          # port 0: a free port
        httpx.post(server.base_url + "/chat/completions", json={...})
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web

from agenttest_worker.demo import coin, echo, expense, generator, simulator, validator
from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer, root_url, start_runner

Responder = Callable[[dict[str, Any]], dict[str, Any]]

MODELS: Mapping[str, Responder] = MappingProxyType(
    {
        expense.MODEL: expense.respond,
        simulator.MODEL: simulator.respond,
        validator.MODEL: validator.respond,
        generator.MODEL: generator.respond,
        echo.MODEL: echo.respond,
        coin.MODEL: coin.respond,
    }
)
DELAY_HEADER = "X-Demo-Delay-Ms"
# Receipts travel as data: URLs inside the JSON body; aiohttp's 1 MiB default is too small.
MAX_BODY_BYTES = 32 * 1024 * 1024
# Stopping should not wait a minute for a delayed request a test has given up on.
SHUTDOWN_TIMEOUT_S = 1.0
START_TIMEOUT_S = 10.0


class _RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, error_type: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": error_type}}, status=status)


def _delay_seconds(request: web.Request) -> float:
    raw = request.headers.get(DELAY_HEADER)
    if raw is None:
        return 0.0
    try:
        delay_ms = int(raw.strip())
    except ValueError:
        raise _RequestError(400, f"{DELAY_HEADER} must be an integer, got {raw!r}") from None
    if delay_ms < 0:
        raise _RequestError(400, f"{DELAY_HEADER} must not be negative, got {delay_ms}")
    return delay_ms / 1000


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _RequestError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _RequestError(400, "request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _RequestError(400, "'messages' must be a list of message objects")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _RequestError(400, "'metadata' must be an object")
    return body


def _responder(body: Mapping[str, Any]) -> Responder:
    model = body.get("model")
    if not isinstance(model, str):
        raise _RequestError(400, "'model' must be a string")
    responder = MODELS.get(model)
    if responder is None:
        known = ", ".join(MODELS)
        raise _RequestError(404, f"The model '{model}' does not exist (known: {known})")
    return responder


async def _chat_completions(request: web.Request) -> web.Response:
    try:
        delay = _delay_seconds(request)
        if delay:
            await asyncio.sleep(delay)
        body = _parse_body(await request.read())
        responder = _responder(body)
    except _RequestError as error:
        return _error(error.status, error.message)
    try:
        answer = responder(body)
    except Exception as exc:  # a bug in a demo agent: still answer in the protocol's shape
        return _error(500, f"demo agent {body['model']!r} failed: {exc!r}", "server_error")
    return web.json_response(answer)


async def _models(request: web.Request) -> web.Response:
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "agenttest-demo"}
        for name in MODELS
    ]
    return web.json_response({"object": "list", "data": data})


def create_app() -> web.Application:
    """The aiohttp application serving the demo agents under /v1."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    return app


def base_url(host: str, port: int) -> str:
    """The /v1 base URL clients use for a server bound to host:port."""
    return root_url(host, port) + "/v1"


async def start_site(host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start serving `create_app()` on host:port (0: a free port); returns the runner
    (call `cleanup()` to stop) and the base URL with the port actually bound."""
    runner, root = await start_runner(create_app(), host, port, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    return runner, root + "/v1"


class DemoServer(ServedOnThread):
    """The demo agents on a background thread with its own event loop.

    `start()` returns the base URL (e.g. "http://127.0.0.1:41234/v1") once the socket
    accepts connections; `stop()` shuts down. As a context manager it starts on entry
    and stops on exit.
    """

    path = "/v1"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = ThreadedServer(
            create_app,
            host=host,
            port=port,
            name="agenttest-demo-server",
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            start_timeout=START_TIMEOUT_S,
        )
