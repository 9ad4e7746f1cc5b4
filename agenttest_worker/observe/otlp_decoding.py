"""OTLP/HTTP trace requests read into AgentSpans: protobuf (`application/x-protobuf`,
through the official definitions of opentelemetry-proto, the `otel` extra) and JSON
(`application/json`, the OTLP JSON mapping: ids in hex, 64-bit integers as strings).

What an agent sends is untrusted: names, texts and attributes are cut, a span keeps at
most `MAX_ATTRIBUTES` attributes, nested values are flattened to text, and a request
holds at most `MAX_SPANS` spans; a malformed request is a ValueError saying why.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from agenttest_worker.observe.received_spans import AgentSpan, turn_of

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_SPANS = 5000
MAX_ATTRIBUTES = 64
MAX_TEXT = 2048
MAX_NAME = 256
_STATUS_ERROR = 2
_MAX_TIME = 2**63 - 1


def decode(body: bytes, content_type: str) -> list[AgentSpan]:
    if content_type == PROTOBUF:
        return _from_protobuf(body)
    if content_type == JSON:
        try:
            document = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"the body is not JSON: {exc}") from None
        return _from_json(document)
    raise LookupError(f"unsupported content type {content_type!r}: send {PROTOBUF} or {JSON}")


def _cut(text: Any, limit: int = MAX_TEXT) -> str:
    return str(text)[:limit]


def _span(fields: dict[str, Any], attributes: dict[str, Any], service: str | None) -> AgentSpan:
    trace_id, span_id = fields["trace_id"], fields["span_id"]
    if len(trace_id) != 32 or len(span_id) != 16:
        raise ValueError("a span's traceId must be 16 bytes and its spanId 8")
    return AgentSpan(
        trace_id=trace_id,
        span_id=span_id,
        # (An id of another length than a span's is none: the parent is not a span here.)
        parent_span_id=fields["parent_span_id"] if len(fields["parent_span_id"]) == 16 else None,
        name=_cut(fields["name"], MAX_NAME),
        start_ns=_time(fields["start"]),
        end_ns=_time(fields["end"]),
        error=int(fields["status_code"] or 0) == _STATUS_ERROR,
        status_message=_cut(fields["status_message"]) or None,
        turn=turn_of(str(fields["trace_state"] or "")),
        service=_cut(service, MAX_NAME) if service is not None else None,
        attributes=dict(list(attributes.items())[:MAX_ATTRIBUTES]),
    )


def _time(value: int) -> int:
    """A time as the store's 64-bit signed column holds it (OTLP's is unsigned)."""
    return min(max(int(value), 0), _MAX_TIME)


def _bounded(spans: list[AgentSpan]) -> list[AgentSpan]:
    if len(spans) > MAX_SPANS:
        raise ValueError(f"more than {MAX_SPANS} spans in one request")
    return spans


# -- protobuf --------------------------------------------------------------------------


def _from_protobuf(body: bytes) -> list[AgentSpan]:
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
    except ImportError:
        raise LookupError(
            f"{PROTOBUF} needs the otel extra (pip install 'agenttest[otel]'); send {JSON}"
        ) from None
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except Exception as exc:  # protobuf's DecodeError (its stubs are not installed)
        raise ValueError(f"the body is not an ExportTraceServiceRequest: {exc}") from None
    spans: list[AgentSpan] = []
    for resource in request.resource_spans:
        service = _pb_attributes(resource.resource.attributes).get("service.name")
        for scope in resource.scope_spans:
            for span in scope.spans:
                fields = {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano,
                    "status_code": span.status.code,
                    "status_message": span.status.message,
                    "trace_state": span.trace_state,
                }
                spans.append(_span(fields, _pb_attributes(span.attributes), service))
                _bounded(spans)
    return spans


def _pb_attributes(items: Any) -> dict[str, Any]:
    return {_cut(item.key, MAX_NAME): _pb_value(item.value) for item in items[:MAX_ATTRIBUTES]}


def _pb_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _cut(value.string_value)
    if kind in ("bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    if kind == "array_value":
        return [_scalar(_pb_value(v)) for v in value.array_value.values[:MAX_ATTRIBUTES]]
    if kind == "kvlist_value":
        return _cut(str({kv.key: _scalar(_pb_value(kv.value)) for kv in value.kvlist_value.values}))
    if kind == "bytes_value":
        return _cut(value.bytes_value.hex())
    return None


def _scalar(value: Any) -> Any:
    """A value kept inside an array: nested ones as text."""
    return value if isinstance(value, str | int | float | bool) or value is None else _cut(value)


# -- JSON ------------------------------------------------------------------------------


def _from_json(document: Any) -> list[AgentSpan]:
    if not isinstance(document, dict):
        raise ValueError("the body is not an ExportTraceServiceRequest object")
    spans: list[AgentSpan] = []
    for resource in _list(document, "resourceSpans"):
        resource_attrs = _json_attributes(_dict(resource, "resource").get("attributes"))
        service = resource_attrs.get("service.name")
        for scope in _list(resource, "scopeSpans"):
            for span in _list(scope, "spans"):
                status = _dict(span, "status")
                fields = {
                    "trace_id": _hex_id(span.get("traceId")),
                    "span_id": _hex_id(span.get("spanId")),
                    "parent_span_id": _hex_id(span.get("parentSpanId") or ""),
                    "name": span.get("name") or "",
                    "start": _integer(span.get("startTimeUnixNano", 0)),
                    "end": _integer(span.get("endTimeUnixNano", 0)),
                    "status_code": _status_code(status.get("code")),
                    "status_message": status.get("message") or "",
                    "trace_state": span.get("traceState") or "",
                }
                attributes = _json_attributes(span.get("attributes"))
                spans.append(_span(fields, attributes, service))
                _bounded(spans)
    return spans


def _list(parent: Any, key: str) -> list[dict[str, Any]]:
    value = parent.get(key) if isinstance(parent, dict) else None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"{key} must be a list of objects")
    return value


def _dict(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _hex_id(value: Any) -> str:
    """An id as the JSON mapping writes it: hex (case-insensitive)."""
    if not isinstance(value, str):
        raise ValueError("a span's traceId and spanId must be hex strings")
    try:
        return bytes.fromhex(value).hex()
    except ValueError:
        raise ValueError(f"not a hex id: {value[:40]!r}") from None


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("a time must be an integer (or its decimal string)")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"not an integer: {str(value)[:40]!r}") from None


def _status_code(value: Any) -> int:
    if value in ("STATUS_CODE_ERROR",):
        return _STATUS_ERROR
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _json_attributes(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    attributes: dict[str, Any] = {}
    for item in items[:MAX_ATTRIBUTES]:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            attributes[_cut(item["key"], MAX_NAME)] = _json_value(item.get("value"))
    return attributes


def _json_value(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return None
    kind, inner = next(iter(value.items()))
    if kind == "stringValue":
        return _cut(inner)
    if kind == "boolValue":
        return bool(inner)
    if kind == "intValue":
        try:
            return int(inner)
        except (TypeError, ValueError):
            return None
    if kind == "doubleValue":
        try:
            return float(inner)
        except (TypeError, ValueError):
            return None
    if kind == "arrayValue" and isinstance(inner, dict):
        values = inner.get("values")
        values = values if isinstance(values, list) else []
        return [_scalar(_json_value(v)) for v in values[:MAX_ATTRIBUTES]]
    if kind == "bytesValue" and isinstance(inner, str):
        try:
            return _cut(base64.b64decode(inner).hex())
        except ValueError:
            return None
    return _cut(json.dumps(inner, default=str))
