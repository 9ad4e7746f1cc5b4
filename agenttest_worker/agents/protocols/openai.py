"""The `openai` protocol: Chat Completions over HTTP.

The case's metadata is not sent unless the agent entry asks (`metadata: object`, or
`strings`: values JSON-encoded, at most 16 keys of 64 characters and values of 512, as
OpenAI allows): the API refuses `metadata` without `store: true`, which `metadata:
object` or `strings` therefore also sends unless `params` sets `store`. The case's other
options (skip, search, mode) travel beside it then: with `object` as an extra `options`
field, with `strings` (which the real API takes) as an `options` key of the metadata. `params`
are added to the body under their Chat Completions names (temperature, seed,
max_completion_tokens, response_format, tool_choice, stop, reasoning_effort, ...).
Replies may carry non-standard `awaiting_input`, `input_hint` and `state` fields, at
the top level or on the message; agents that declare their state that way are believed.

With `stream: true` the request asks for Server-Sent Events (`stream_options:
{include_usage: true}`): `chat.completion.chunk` objects whose `delta` carries pieces
of the content and of the tool calls (each call's id and name in its first piece, its
arguments in pieces, matched by `index`), `finish_reason` on the last choice chunk,
`usage` on a final chunk with no choices, then `data: [DONE]`.
"""

from __future__ import annotations

import json
from typing import Any

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.http.streaming import (
    TOOL_NAME,
    StreamEvent,
    StreamFailure,
    StreamSpec,
    TextPieces,
    json_data,
    mark_content,
)
from agenttest_worker.agents.interface import (
    AgentError,
    AgentReply,
    AgentRequest,
    MetadataMode,
    protocol,
    read_tool_calls,
    text_of,
)
from agenttest_worker.agents.protocols.json_client import JsonAgentClient, as_bool, usage_from
from agenttest_worker.results import Usage

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


def sendable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as Chat Completions takes it: an assistant message without content
    (a reply that said nothing, or refused) has "" unless it calls tools, since the API
    refuses a null content there. Copied only when one needs it."""

    def silent(message: dict[str, Any]) -> bool:
        return (
            message.get("role") == "assistant"
            and message.get("content") is None
            and not message.get("tool_calls")
        )

    if not any(silent(m) for m in messages):
        return messages
    return [{**m, "content": ""} if silent(m) else m for m in messages]


def without_tool_settings(body: dict[str, Any], settings: tuple[str, ...]) -> dict[str, Any]:
    """The body without the params that only go with tools when it has none: tools are
    sent to the target alone, and the APIs refuse `tool_choice` without them (an entry
    that is a target and a judge has its params in both roles' calls)."""
    if "tools" not in body:
        for setting in settings:
            body.pop(setting, None)
    return body


def needs_base_url(config: AgentConfig) -> str | None:
    if not config.base_url:
        return "an openai agent needs base_url (e.g. http://127.0.0.1:8700/v1)"
    if config.deployment or config.api_version:
        # Both make it an azure agent (agents/config.py): one alone is half of that.
        return (
            "an openai agent on Azure OpenAI sets both deployment and api_version "
            "(or write protocol: azure)"
        )
    return azure_only(config) or streams_whole(config, "an openai")


def azure_only(config: AgentConfig) -> str | None:
    if config.azure_ad_token_env:
        return "azure_ad_token_env is for azure agents"
    return None


def streams_whole(config: AgentConfig, agent: str) -> str | None:
    """What a Chat Completions or Messages agent may not set: a framing, a history."""
    if not isinstance(config.stream, bool):
        return f"{agent} agent streams with stream: true (sse and ndjson are for http agents)"
    if config.history is not None:
        return "history is for http agents"
    return None


@protocol("openai", check=needs_base_url)
class OpenAIClient(JsonAgentClient):
    def endpoint(self) -> str:
        assert self.config.base_url is not None
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def body(self, request: AgentRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model or self.name,
            "messages": sendable(request.messages),
        }
        mode = self.config.metadata_mode()
        given = request.metadata
        if request.options and mode == "strings":
            # Chat Completions has no `options` field: in OpenAI's own metadata format the
            # options travel inside the metadata, first so that no key limit cuts them.
            given = {"options": request.options, **given}
        metadata = encode_metadata(given, mode)
        if metadata is not None:
            body["metadata"] = metadata
            # OpenAI takes `metadata` only on completions it stores.
            body["store"] = True
        if request.options and mode == "object":
            # Not a Chat Completions field: an extra body field for agents that read the
            # spec's context.Options (skip, search, mode), sent only when a case sets one.
            body["options"] = request.options
        if self.config.tools and request.role == "target":
            body["tools"] = tool_definitions(self.config.tools)
        if self.config.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update(self.params(request))
        return without_tool_settings(body, ("tool_choice", "parallel_tool_calls"))

    def parse(self, data: Any) -> AgentReply:
        return parse_completion(data, self.name)

    def stream_spec(self) -> StreamSpec | None:
        if not self.config.stream:
            return None
        return StreamSpec("sse", lambda: ChunkAssembler(self.name))


class ChunkAssembler:
    """A Chat Completions stream put together: the first choice's deltas, in order."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.first_token_at: float | None = None
        self.parts = TextPieces(f"{agent}'s reply")
        # Tool calls by their `index`: id, name and the argument pieces so far.
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.declared: dict[str, Any] = {}
        self.done = False

    def feed(self, event: StreamEvent) -> bool:
        if event.data.strip() == "[DONE]":
            self.done = True
            return True
        chunk = json_data(event, self.agent)
        if not isinstance(chunk, dict):
            raise StreamFailure(
                f"agent error: {self.agent} sent a stream chunk that is not an object"
            )
        error = chunk.get("error")
        if error:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise StreamFailure(f"agent error: {self.agent}: {message}", raw=event.data[:4096])
        if isinstance(chunk.get("usage"), dict):
            self.usage = usage_from(chunk["usage"])
        self._declare(chunk)
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)
        return False

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        self._declare(delta)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.parts.add(content)
            mark_content(self)
        pieces = delta.get("tool_calls")
        for piece in pieces if isinstance(pieces, list) else []:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index")
            index = index if isinstance(index, int) else len(self.calls)
            call = self.calls.get(index)
            if call is None:
                what = f"{self.agent}'s tool call {index}"
                call = self.calls[index] = {
                    "id": None,
                    "name": TextPieces(f"{what}'s name", TOOL_NAME),
                    "arguments": TextPieces(f"{what}'s arguments"),
                }
            if piece.get("id"):
                call["id"] = piece["id"]
            function = piece.get("function")
            function = function if isinstance(function, dict) else {}
            if isinstance(function.get("name"), str):
                call["name"].add(function["name"])
            if isinstance(function.get("arguments"), str):
                call["arguments"].add(function["arguments"])
            mark_content(self)
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]

    def _declare(self, where: dict[str, Any]) -> None:
        for key in ("awaiting_input", "input_hint", "state"):
            if where.get(key) is not None:
                self.declared[key] = where[key]

    def finish(self) -> None:
        # A stream that said why it stopped is complete even without [DONE] (some
        # servers leave it out); one that did not was cut off.
        if not self.done and self.finish_reason is None:
            raise StreamFailure(
                f"agent error: {self.agent}'s stream ended before data: [DONE]", retryable=True
            )

    def reply(self) -> AgentReply:
        raw_calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"].text(), "arguments": call["arguments"].text()},
            }
            for _, call in sorted(self.calls.items())
        ]
        calls = read_tool_calls(raw_calls or None)
        hint = self.declared.get("input_hint")
        return AgentReply(
            content=self.parts.text() if self.parts or not raw_calls else None,
            tool_calls=calls.calls,
            raw_tool_calls=calls.raw_items or None,
            problems=calls.problems,
            finish_reason=self.finish_reason,
            awaiting_input=as_bool(self.declared.get("awaiting_input")),
            input_hint=hint if isinstance(hint, str) else None,
            state=self.declared.get("state"),
            usage=self.usage,
        )


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
