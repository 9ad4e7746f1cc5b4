"""An OTLP/HTTP trace receiver (POST /v1/traces): agents' spans, protobuf or JSON, handed
to an intake that keeps those of conversations being played (driver/span_intake.py).

It answers as an OTLP collector does: 200 with an ExportTraceServiceResponse (in the
request's encoding; `partialSuccess` counts the spans not kept), 400 for a body that
cannot be read, 413 past `MAX_BODY_BYTES`, 415 for another encoding. Served on a thread
of its own, with its own event loop, beside whatever the process does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable

from aiohttp import web

from agenttest_worker.observe.otlp_decoding import JSON, PROTOBUF, decode
from agenttest_worker.observe.received_spans import AgentSpan

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
# Keeps what it can of a request's spans; returns how many it kept.
Intake = Callable[[list[AgentSpan]], int]


def receiver_app(intake: Intake) -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        kind = request.content_type
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes", kind)
        try:
            spans = decode(body, kind)
        except LookupError as exc:
            return _error(415, str(exc), JSON)
        except ValueError as exc:
            return _error(400, str(exc), kind)
        kept = await asyncio.to_thread(intake, spans) if spans else 0
        return _accepted(len(spans) - kept, kind)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/v1/traces", traces)
    return app


def _accepted(rejected: int, kind: str) -> web.Response:
    message = "spans of no conversation being played are not kept" if rejected else ""
    if kind == PROTOBUF:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTracePartialSuccess,
            ExportTraceServiceResponse,
        )

        reply = ExportTraceServiceResponse()
        if rejected:
            reply.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
            )
        return web.Response(body=reply.SerializeToString(), content_type=PROTOBUF)
    document = (
        {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}
        if rejected
        else {}
    )
    return web.json_response(document)


def _error(status: int, message: str, kind: str) -> web.Response:
    # OTLP's error body is a google.rpc.Status; as JSON it reads the same to a person.
    return web.Response(
        status=status,
        text=json.dumps({"code": 3, "message": message}),
        content_type=JSON,
    )


class SpanReceiver:
    """`receiver_app(intake)` served on host:port from a daemon thread."""

    def __init__(self, intake: Intake, host: str, port: int) -> None:
        self._app = receiver_app(intake)
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="agenttest-otlp")
        self._thread.daemon = True

    def start(self) -> None:
        """Listen (OSError when the port is taken), then serve on the thread."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        try:
            future.result(timeout=10)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    async def _listen(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
