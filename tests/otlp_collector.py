"""An OTLP/HTTP trace receiver for the tests, built from the official protobuf
definitions (opentelemetry-proto): it keeps every span it is sent, as plain data."""

from __future__ import annotations

import threading
import time
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from agenttest_worker.demo.threaded import ThreadedServer


class Collector:
    """An OTLP/HTTP trace receiver (protobuf), keeping every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        self._server = ThreadedServer(self._app, name="otlp-collector")

    def __enter__(self) -> Collector:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def endpoint(self) -> str:
        return self._server.url

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            self.bodies.append(body)
            for resource in export.resource_spans:
                service = _attributes(resource.resource.attributes)
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(_span(span, service))
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        return app

    def wait_for(self, name: str, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [s for s in self.spans if s["name"] == name]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


def _span(span: Any, resource: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "kind": span.kind,
        "start": span.start_time_unix_nano,
        "end": span.end_time_unix_nano,
        "attributes": _attributes(span.attributes),
        "events": [(e.name, _attributes(e.attributes)) for e in span.events],
        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        "status": span.status.code,
        "service": resource.get("service.name"),
        "resource": resource,
    }
