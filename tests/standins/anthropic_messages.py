"""A strict stand-in for Anthropic's Messages API (POST /v1/messages).

Written from the API reference. It refuses what the API refuses, in its error shape
`{"type": "error", "error": {"type", "message"}, "request_id"}`:

- no `anthropic-version` header (400), no key or a wrong one (`x-api-key`, or a bearer
  token as the official client sends it) when the stand-in has a key (401
  `authentication_error`);
- a field the reference does not define ("seed: Extra inputs are not permitted"), a
  field of the wrong type ("max_tokens: Input should be a valid integer"), a missing
  `model`, `max_tokens` or `messages` ("max_tokens: Field required"), a temperature
  outside 0–1, `metadata` other than `user_id`, `tool_choice` without `tools`;
- messages that break the reference: a role other than user and assistant (system goes
  top-level), empty content, `tool_use` blocks not answered by `tool_result` blocks in
  the next message, a `tool_result` that answers no `tool_use` of the message before,
  text blocks that are empty or only whitespace,
  tools without an `input_schema`.

What it accepts it answers from the script: a `message`, or with `stream: true` the
events message_start, content_block_start / content_block_delta (text_delta,
input_json_delta) / content_block_stop per block, a ping, message_delta (stop_reason,
usage) and message_stop.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from standins.scripting import (
    Answer,
    Received,
    Refusal,
    ScriptedStandIn,
    count_tokens,
    sse,
    text_tokens,
    write_events,
)

# The API versions the reference lists (2026-10-21: what the official client sends now).
VERSIONS = ("2023-01-01", "2023-06-01", "2026-10-21")
# The request body's fields and what each must be ("number" for int or float).
MESSAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("string",),
    "max_tokens": ("integer",),
    "messages": ("list",),
    "cache_control": ("dictionary", "null"),
    "container": ("string", "dictionary", "null"),
    "context_management": ("dictionary", "null"),
    "inference_geo": ("string", "null"),
    "mcp_servers": ("list",),
    "metadata": ("dictionary",),
    "output_config": ("dictionary",),
    "service_tier": ("string",),
    "speed": ("string", "null"),
    "stop_sequences": ("list",),
    "stream": ("boolean",),
    "system": ("string", "list"),
    "temperature": ("number",),
    "thinking": ("dictionary",),
    "tool_choice": ("dictionary",),
    "tools": ("list",),
    "top_k": ("integer",),
    "top_p": ("number",),
}
REQUIRED = ("max_tokens", "messages", "model")
BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control"},
    "document": {"type", "source", "title", "context", "citations", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}
TOOL_KEYS = {
    "type",
    "name",
    "description",
    "input_schema",
    "cache_control",
    "allowed_callers",
    "defer_loading",
    "eager_input_streaming",
    "input_examples",
    "strict",
}
USER_BLOCKS = {"text", "image", "document", "tool_result"}
ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}


def anthropic_error(status: int, kind: str, message: str) -> Refusal:
    body = {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": "req_standin",
    }
    return Refusal(status, body)


def invalid(message: str) -> Refusal:
    return anthropic_error(400, "invalid_request_error", message)


def _is(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "null":
        return value is None
    types = {"string": str, "boolean": bool, "list": list, "dictionary": dict}
    return isinstance(value, types[kind])


def _typed(where: str, value: Any, kinds: tuple[str, ...]) -> None:
    if not any(_is(k, value) for k in kinds):
        wanted = next(k for k in kinds if k != "null")
        raise invalid(f"{where}: Input should be a valid {wanted}")


def _known(where: str, value: dict[str, Any], allowed: set[str]) -> None:
    for key in value:
        if key not in allowed:
            raise invalid(f"{where}.{key}: Extra inputs are not permitted")


def check_messages_request(body: Any) -> dict[str, Any]:
    """The body, when the Messages API would accept it; else the API's refusal."""
    if not isinstance(body, dict):
        raise invalid("Input should be a valid dictionary")
    for key in body:
        if key not in MESSAGE_FIELDS:
            raise invalid(f"{key}: Extra inputs are not permitted")
    for key in REQUIRED:
        if key not in body:
            raise invalid(f"{key}: Field required")
    for key, value in body.items():
        _typed(key, value, MESSAGE_FIELDS[key])
    if "temperature" in body and not 0 <= body["temperature"] <= 1:
        bound = (
            "less than or equal to 1" if body["temperature"] > 1 else "greater than or equal to 0"
        )
        raise invalid(f"temperature: Input should be {bound}")
    if body["max_tokens"] < 1:
        raise invalid("max_tokens: Input should be greater than or equal to 1")
    if "metadata" in body:
        _known("metadata", body["metadata"], {"user_id"})
    system = body.get("system")
    if isinstance(system, list):
        for n, block in enumerate(system):
            _block(f"system.{n}", block, {"text"})
    for n, tool in enumerate(body.get("tools") or []):
        _typed(f"tools.{n}", tool, ("dictionary",))
        if "type" not in tool or tool["type"] == "custom":
            _known(f"tools.{n}", tool, TOOL_KEYS)
            for key in ("name", "input_schema"):
                if key not in tool:
                    raise invalid(f"tools.{n}.{key}: Field required")
            if not re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", str(tool["name"])):
                raise invalid(
                    f"tools.{n}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
                )
    if "tool_choice" in body and not body.get("tools"):
        raise invalid("tool_choice: tool_choice may only be specified while providing tools.")
    _check_messages(body["messages"])
    return body


def _block(where: str, block: Any, allowed: set[str]) -> dict[str, Any]:
    _typed(where, block, ("dictionary",))
    kind = block.get("type")
    if kind not in allowed:
        tags = ", ".join(f"'{t}'" for t in sorted(allowed))
        raise invalid(
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the "
            f"expected tags: {tags}"
        )
    _known(where, block, BLOCK_KEYS[kind])
    if kind == "text":
        _typed(f"{where}.text", block.get("text"), ("string",))
        if not block["text"]:
            raise invalid("messages: text content blocks must be non-empty")
        if not block["text"].strip():
            raise invalid("messages: text content blocks must contain non-whitespace text")
    if kind == "tool_use":
        for key in ("id", "name", "input"):
            if key not in block:
                raise invalid(f"{where}.{key}: Field required")
        _typed(f"{where}.input", block["input"], ("dictionary",))
    if kind == "tool_result":
        if "tool_use_id" not in block:
            raise invalid(f"{where}.tool_use_id: Field required")
        _typed(f"{where}.content", block.get("content", ""), ("string", "list"))
    return block


def _check_messages(messages: list[Any]) -> None:
    pending: list[str] = []
    for n, message in enumerate(messages):
        where = f"messages.{n}"
        _typed(where, message, ("dictionary",))
        _known(where, message, {"role", "content"})
        for key in ("role", "content"):
            if key not in message:
                raise invalid(f"{where}.{key}: Field required")
        role, content = message["role"], message["content"]
        if role not in ("user", "assistant"):
            raise invalid(f"{where}.role: Input should be 'user' or 'assistant'")
        _typed(f"{where}.content", content, ("string", "list"))
        last = n == len(messages) - 1
        if not content and not (last and role == "assistant"):
            raise invalid(
                f"{where}: all messages must have non-empty content except for the optional "
                "final assistant message"
            )
        blocks = (
            [
                _block(
                    f"{where}.content.{i}", b, USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
                )
                for i, b in enumerate(content)
            ]
            if isinstance(content, list)
            else []
        )
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        for i, block in enumerate(blocks):
            if block["type"] == "tool_result" and block["tool_use_id"] not in pending:
                raise invalid(
                    f"{where}.content.{i}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block['tool_use_id']}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
        missing = [i for i in pending if i not in results]
        if missing:
            raise invalid(
                f"messages.{n - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
    if pending:
        raise invalid(
            f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
            f"blocks immediately after: {', '.join(pending)}. Each `tool_use` block must "
            "have a corresponding `tool_result` block in the next message."
        )


class MessageReply:
    """The replies of the Messages API for an accepted request and its answer."""

    def __init__(self, body: dict[str, Any], answer: Answer, serial: int) -> None:
        declared = {t.get("name") for t in body.get("tools") or []}
        undeclared = [c.name for c in answer.tool_calls if c.name not in declared]
        if undeclared:
            raise Refusal(
                500,
                {
                    "type": "error",
                    "error": {
                        "type": "api_error",
                        "message": f"stand-in: scripted a call to {undeclared[0]!r}, "
                        "a tool the request does not declare",
                    },
                },
            )
        self.body = body
        self.id = f"msg_standin{serial}"
        self.content: list[dict[str, Any]] = []
        if answer.text:
            self.content.append({"type": "text", "text": answer.text})
        for n, call in enumerate(answer.tool_calls):
            self.content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_standin{serial}_{n}",
                    "name": call.name,
                    "input": dict(call.arguments),
                }
            )
        self.stop_reason = "tool_use" if answer.tool_calls else "end_turn"
        self.input_tokens = text_tokens(body["messages"]) + text_tokens(body.get("system"))
        self.output_tokens = count_tokens(answer.text or "") + sum(
            count_tokens(json.dumps(dict(c.arguments))) for c in answer.tool_calls
        )

    def _message(
        self, content: list[dict[str, Any]], stop: str | None, output: int
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": output,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "service_tier": "standard",
            },
        }

    def whole(self) -> dict[str, Any]:
        return self._message(self.content, self.stop_reason, self.output_tokens)

    def events(self) -> list[bytes]:
        def event(kind: str, **data: Any) -> bytes:
            return sse({"type": kind, **data}, kind)

        out = [event("message_start", message=self._message([], None, 1))]
        for index, block in enumerate(self.content):
            if block["type"] == "text":
                out.append(
                    event(
                        "content_block_start",
                        index=index,
                        content_block={"type": "text", "text": ""},
                    )
                )
                if index == 0:
                    out.append(event("ping"))
                for word in re.findall(r"\S+\s*|\s+", block["text"]):
                    out.append(
                        event(
                            "content_block_delta",
                            index=index,
                            delta={"type": "text_delta", "text": word},
                        )
                    )
            else:
                start = {**block, "input": {}}
                out.append(event("content_block_start", index=index, content_block=start))
                arguments = json.dumps(block["input"])
                for at in range(0, len(arguments), 8):
                    delta = {"type": "input_json_delta", "partial_json": arguments[at : at + 8]}
                    out.append(event("content_block_delta", index=index, delta=delta))
            out.append(event("content_block_stop", index=index))
        out.append(
            event(
                "message_delta",
                delta={"stop_reason": self.stop_reason, "stop_sequence": None},
                usage={"output_tokens": self.output_tokens},
            )
        )
        out.append(event("message_stop"))
        return out


class AnthropicMessagesStandIn(ScriptedStandIn):
    """POST /v1/messages, strictly. `api_key`: the `x-api-key` it expects (None: any)."""

    name = "anthropic-standin"

    def __init__(self, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key
        self._serial = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._handle)

    def check_headers(self, received: Received) -> None:
        # The key in `x-api-key`, or as a bearer token (how the official client sends it).
        bearer = received.headers.get("Authorization", "")
        key = received.headers.get("x-api-key") or (
            bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
        )
        if self.api_key is not None and key is None:
            raise anthropic_error(401, "authentication_error", "x-api-key header is required")
        if self.api_key is not None and key != self.api_key:
            raise anthropic_error(401, "authentication_error", "invalid x-api-key")
        version = received.headers.get("anthropic-version")
        if version is None:
            raise invalid("anthropic-version: header is required")
        if version not in VERSIONS:
            raise invalid(f"anthropic-version: invalid version: {version}")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        received, raw = await self.record(request)
        try:
            if request.method != "POST" or request.path != "/v1/messages":
                raise anthropic_error(404, "not_found_error", "Not Found")
            self.check_headers(received)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            check_messages_request(body)
            with self._lock:
                self._serial += 1
                serial = self._serial
            reply = MessageReply(body, self.answer(body["model"], body), serial)
            if body.get("stream"):
                return await write_events(request, reply.events())
            return web.json_response(reply.whole())
        except Refusal as refusal:
            return self.refused(received, refusal)
