"""An agent instrumented with the official OpenTelemetry SDK, served over real HTTP with
the OpenAI Chat Completions protocol: it continues the trace its caller's `traceparent`
names, runs its "tools" as spans (`execute_tool NAME`, the GenAI conventions'
attributes) and exports them with a BatchSpanProcessor to an OTLP/HTTP endpoint, as
protobuf (the official exporter) or as OTLP JSON.

What it does for a message is `plan`: the last user message's text maps to a list of
(tool, arguments, failed) it runs, in order, before it answers.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agenttest_worker.demo.threaded import ThreadedServer

Step = tuple[str, dict[str, Any], bool]


class JsonSpanExporter(SpanExporter):
    """OTLP/HTTP with the JSON encoding: the protobuf request in proto3's JSON mapping,
    ids as hex (as OTLP's JSON mapping says), enums as integers."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        document = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        for resource in document.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64decode(span[key]).hex()
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps(document).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            reply.read()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class InstrumentedAgent:
    def __init__(self, endpoint: str, plan: dict[str, list[Step]], encoding: str) -> None:
        self.plan = plan
        self.traceparents: list[str | None] = []
        exporter: SpanExporter = (
            OTLPSpanExporter(endpoint=endpoint)
            if encoding == "protobuf"
            else JsonSpanExporter(endpoint)
        )
        self.provider = TracerProvider(resource=Resource.create({"service.name": "refund-bot"}))
        # Batches, a second apart: the spans arrive after the reply, as from a real agent.
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
        self.tracer = self.provider.get_tracer("refund-bot")
        self._server = ThreadedServer(self._app, name="instrumented-agent")

    def __enter__(self) -> InstrumentedAgent:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self.provider.shutdown()

    @property
    def base_url(self) -> str:
        return self._server.url + "/v1"

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.traceparents.append(request.headers.get("traceparent"))
        context = TraceContextTextMapPropagator().extract(dict(request.headers))
        text = str(body["messages"][-1]["content"])
        with self.tracer.start_as_current_span(
            "POST /v1/chat/completions", context=context, kind=SpanKind.SERVER
        ):
            for tool, args, failed in self.plan.get(text, []):
                with self.tracer.start_as_current_span(f"execute_tool {tool}") as span:
                    span.set_attribute("gen_ai.operation.name", "execute_tool")
                    span.set_attribute("gen_ai.tool.name", tool)
                    span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
                    if failed:
                        span.set_status(Status(StatusCode.ERROR, f"{tool} failed"))
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"done: {text}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
        )

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app
