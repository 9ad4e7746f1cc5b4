"""The `openai` protocol: Chat Completions over HTTP.

Metadata travels in the body as `metadata`. Hosted APIs accept only a few short string
values there, so an agent may say `metadata: strings` (values JSON-encoded, at most 16
keys of 64 characters and values of 512, as OpenAI allows) or `metadata: none`. The
case's other options (skip, search, mode) travel beside it as an extra `options` field.
Replies may carry non-standard `awaiting_input`, `input_hint` and `state` fields, at
the top level or on the message; agents that declare their state that way are believed.
"""

from __future__ import annotations

import json
from typing import Any

from agenttest_worker.agents.base import (
    AgentError,
    AgentReply,
    AgentRequest,
    protocol,
    read_tool_calls,
    text_of,
)
from agenttest_worker.agents.config import AgentConfig, MetadataMode
from agenttest_worker.agents.protocols.json_client import JsonAgentClient, as_bool, usage_from

MAX_METADATA_KEYS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def encode_metadata(metadata: dict[str, Any], mode: MetadataMode) -> dict[str, Any] | None:
    if mode == "none" or not metadata:
        return None
    if mode == "object":
        return metadata
    encoded: dict[str, str] = {}
    for key, value in list(metadata.items())[:MAX_METADATA_KEYS]:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        encoded[str(key)[:MAX_METADATA_KEY]] = text[:MAX_METADATA_VALUE]
    return encoded


def tool_definitions(tools: list[Any]) -> list[dict[str, Any]]:
    """Tools from the registry as Chat Completions tool definitions (a bare name is allowed)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, str):
            out.append(
                {
                    "type": "function",
                    "function": {"name": tool, "parameters": {"type": "object", "properties": {}}},
                }
            )
        elif isinstance(tool, dict):
            out.append(tool if "type" in tool else {"type": "function", "function": tool})
    return out


def needs_base_url(config: AgentConfig) -> str | None:
    if config.base_url:
        return None
    return "an openai agent needs base_url (e.g. http://127.0.0.1:8700/v1)"


@protocol("openai", check=needs_base_url)
class OpenAIClient(JsonAgentClient):
    def endpoint(self) -> str:
        assert self.config.base_url is not None
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def body(self, request: AgentRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model or self.name,
            "messages": request.messages,
        }
        metadata = encode_metadata(request.metadata, self.config.metadata)
        if metadata is not None:
            body["metadata"] = metadata
        if request.options:
            # Not a Chat Completions field: an extra body field for agents that read the
            # spec's context.Options (skip, search, mode), sent only when a case sets one.
            body["options"] = request.options
        if self.config.tools and request.role == "target":
            body["tools"] = tool_definitions(self.config.tools)
        return body

    def parse(self, data: Any) -> AgentReply:
        return parse_completion(data, self.name)


def parse_completion(data: Any, agent: str) -> AgentReply:
    if not isinstance(data, dict):
        raise AgentError("parse", f"agent error: {agent} replied with JSON that is not an object")
    error = data.get("error")
    if isinstance(error, dict):
        raise AgentError("http", f"agent error: {agent}: {error.get('message', error)}")
    if isinstance(error, str) and error.strip():
        raise AgentError("http", f"agent error: {agent}: {error}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AgentError("parse", f"agent error: {agent} reply has no choices")
    choice = choices[0]
    raw_message = choice.get("message")
    message: dict[str, Any] = raw_message if isinstance(raw_message, dict) else {}
    raw_calls = message.get("tool_calls")
    usage = data.get("usage")

    def declared(key: str) -> Any:
        # On the message, else at the top level (an explicit null on the message is absent).
        value = message.get(key)
        return value if value is not None else data.get(key)

    hint = declared("input_hint")
    finish_reason = choice.get("finish_reason")
    calls = read_tool_calls(raw_calls)
    return AgentReply(
        content=text_of(message.get("content")),
        tool_calls=calls.calls,
        # The history keeps the calls as the agent wrote them, those that could be read.
        raw_tool_calls=calls.raw_items or None,
        problems=calls.problems,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        awaiting_input=as_bool(declared("awaiting_input")),
        input_hint=hint if isinstance(hint, str) else None,
        state=declared("state"),
        usage=usage_from(usage),
    )
