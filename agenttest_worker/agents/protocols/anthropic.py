"""The `anthropic` protocol: the Messages API at `{base_url}/v1/messages`.

The conversation the engine keeps is in Chat Completions shape; here it becomes a
Messages request: system messages become the top-level `system`; an assistant's tool
calls become `tool_use` blocks and the runner's `tool` messages (mocked results)
`tool_result` blocks in the next user message; images travel as base64 `image` blocks
(a URL image as a `url` source), PDFs and text files as `document` blocks. Replies come
back the other way: text blocks are the content, `tool_use` blocks the tool calls,
`stop_reason` and `usage` are recorded.

The key goes in `x-api-key` (from `api_key_env`) with `anthropic-version`. `max_tokens`
is required by the API (agenttest.yaml's, default 4096). The Messages API accepts only
`user_id` in `metadata`, so the case's metadata is not sent (the role prompts carry it).
Replies, whole or streamed, are read in protocols/anthropic_reply.py.
"""

from __future__ import annotations

import base64
from typing import Any

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.http.streaming import StreamSpec
from agenttest_worker.agents.interface import (
    AgentError,
    AgentReply,
    AgentRequest,
    object_of,
    parse_arguments,
    protocol,
    text_of,
)
from agenttest_worker.agents.protocols.anthropic_reply import (
    MessageAssembler,
    error_text,
    parse_message,
)
from agenttest_worker.agents.protocols.json_client import JsonAgentClient, body_json, say_api_error
from agenttest_worker.agents.protocols.openai import (
    azure_only,
    streams_whole,
    tool_definitions,
    without_tool_settings,
)

# Messages must end with a user turn: a trailing assistant message would be taken as
# the start of the model's own reply (a prefill). Role calls (a simulator reading the
# conversation so far) end with the agent's reply, so this turn is added after it.
YOUR_TURN = "(Reply now, as the system prompt asks.)"


def needs_base_url(config: AgentConfig) -> str | None:
    if not config.base_url:
        return "an anthropic agent needs base_url (e.g. https://api.anthropic.com)"
    if config.deployment or config.api_version:
        return "deployment and api_version are for azure agents"
    return azure_only(config) or streams_whole(config, "an anthropic")


def _data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a base64 `data:` URL."""
    if not url.startswith("data:") or ";base64," not in url:
        return None
    head, _, data = url.partition(";base64,")
    return head.removeprefix("data:") or "application/octet-stream", data


def _part_blocks(part: Any) -> list[dict[str, Any]]:
    """One Chat Completions content part as Messages content blocks."""
    if not isinstance(part, dict):
        return []
    kind = part.get("type")
    if kind in ("text", "output_text"):
        text = part.get("text") or ""
        return [{"type": "text", "text": text}] if text.strip() else []
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url", "") if isinstance(image, dict) else str(image or "")
        inline = _data_url(url)
        if inline is not None:
            media, data = inline
            return [
                {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
            ]
        return [{"type": "image", "source": {"type": "url", "url": url}}]
    if kind == "file":
        file = object_of(part.get("file"))
        name = str(file.get("filename") or "attachment")
        inline = _data_url(str(file.get("file_data") or ""))
        if inline is not None and inline[0] == "application/pdf":
            source = {"type": "base64", "media_type": "application/pdf", "data": inline[1]}
            return [{"type": "document", "source": source, "title": name}]
        if inline is not None and inline[0].startswith("text/"):
            text = base64.b64decode(inline[1]).decode("utf-8", errors="replace")
            source = {"type": "text", "media_type": "text/plain", "data": text}
            return [{"type": "document", "source": source, "title": name}]
        return [{"type": "text", "text": f"[attachment {name}: not a type Messages accepts]"}]
    return []


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        # The API refuses a text block of whitespace alone, as it does an empty one.
        return [{"type": "text", "text": content}] if content.strip() else []
    if isinstance(content, list):
        return [block for part in content for block in _part_blocks(part)]
    return [{"type": "text", "text": str(content)}]


def _tool_use(call: Any, index: int) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    function = object_of(call.get("function"))
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = parse_arguments(function.get("arguments"))
    return {
        "type": "tool_use",
        "id": str(call.get("id") or f"toolu_{index}"),
        "name": name,
        # The API takes an object: arguments that were not one are kept under "value".
        "input": args if isinstance(args, dict) else {"value": args},
    }


def to_messages(history: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(system, messages) for a Messages request from a Chat Completions history."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        # Consecutive messages of one role are one message (tool results and the next
        # input together in the user turn that follows the tool calls).
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in history:
        role = message.get("role")
        if role in ("system", "developer"):
            text = text_of(message.get("content"))
            if text:
                system.append(text)
        elif role == "user":
            add("user", _blocks(message.get("content")))
        elif role == "assistant":
            calls = message.get("tool_calls")
            uses = [_tool_use(c, i) for i, c in enumerate(calls if isinstance(calls, list) else [])]
            add("assistant", [*_blocks(message.get("content")), *(u for u in uses if u)])
        elif role == "tool":
            content = text_of(message.get("content")) or ""
            block = {
                "type": "tool_result",
                "tool_use_id": str(message.get("tool_call_id")),
                "content": content,
            }
            add("user", [block])
    if out and out[-1]["role"] == "assistant":
        add("user", [{"type": "text", "text": YOUR_TURN}])
    return ("\n\n".join(system) or None), out


def tools(registry_tools: list[Any]) -> list[dict[str, Any]]:
    """agenttest.yaml's tools as Messages tool definitions ({name, description, input_schema})."""
    out: list[dict[str, Any]] = []
    for tool in registry_tools:
        if isinstance(tool, dict) and "input_schema" in tool:
            out.append(tool)
            continue
        for definition in tool_definitions([tool]):
            function = definition.get("function") or {}
            entry: dict[str, Any] = {
                "name": function.get("name"),
                "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
            }
            if function.get("description"):
                entry["description"] = function["description"]
            out.append(entry)
    return out


@protocol("anthropic", check=needs_base_url)
class AnthropicClient(JsonAgentClient):
    records_stop_reason = True

    def endpoint(self) -> str:
        assert self.config.base_url is not None
        base = self.config.base_url.rstrip("/")
        return base + ("/messages" if base.endswith("/v1") else "/v1/messages")

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.config.anthropic_version, **self.config.headers}
        key = self.config.api_key()
        if key:
            headers["x-api-key"] = key
        return headers

    def body(self, request: AgentRequest) -> dict[str, Any]:
        system, messages = to_messages(request.messages)
        body: dict[str, Any] = {
            "model": self.config.model or self.name,
            "max_tokens": self.config.max_tokens,
            "messages": messages,
        }
        if system is not None:
            body["system"] = system
        if self.config.tools and request.role == "target":
            body["tools"] = tools(self.config.tools)
        if self.config.stream:
            body["stream"] = True
        # The Messages API's own names: max_tokens, stop_sequences, thinking, temperature,
        # top_p, ... (`max_tokens` here wins over the entry's max_tokens).
        body.update(self.params(request))
        return without_tool_settings(body, ("tool_choice",))

    def parse(self, data: Any) -> AgentReply:
        return parse_message(data, self.name)

    def stream_spec(self) -> StreamSpec | None:
        if not self.config.stream:
            return None
        return StreamSpec("sse", lambda: MessageAssembler(self.name))

    async def complete(self, request: AgentRequest) -> AgentReply:
        try:
            return await super().complete(request)
        except AgentError as error:
            if error.kind == "http":  # its body is a Messages error
                say_api_error(error, self.name, error_text(body_json(error.raw)))
            raise
