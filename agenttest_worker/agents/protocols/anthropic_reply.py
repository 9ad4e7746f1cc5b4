"""Reading Messages replies: a whole `message`, or the events of a streamed one.

A stream is `message_start` (the message with empty content and the input usage), then
per content block `content_block_start`, `content_block_delta` (`text_delta` pieces of
text, `input_json_delta` pieces of a tool_use block's input JSON) and
`content_block_stop`; then `message_delta` (`stop_reason`, the output usage so far)
and `message_stop`. `ping` may come at any time; an `error` event ends the stream
(`overloaded_error` there is what a 529 is to a whole reply). Event types the API adds
later are passed over, as its versioning policy asks.
"""

from __future__ import annotations

import json
from typing import Any

from agenttest_worker.agents.http.streaming import (
    TOOL_NAME,
    StreamEvent,
    StreamFailure,
    TextPieces,
    json_data,
    mark_content,
    over_bound,
)
from agenttest_worker.agents.interface import AgentError, AgentReply, object_of, read_tool_calls
from agenttest_worker.agents.protocols.json_client import as_bool
from agenttest_worker.results import Usage

# Error events worth another attempt when no content came yet (HTTP 529, 500, 429).
RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


def usage_of(usage: Any) -> Usage | None:
    """Messages usage as token counts: cached input tokens count as prompt tokens."""
    if not isinstance(usage, dict):
        return None

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    prompt = (
        count("input_tokens")
        + count("cache_creation_input_tokens")
        + count("cache_read_input_tokens")
    )
    completion = count("output_tokens")
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def error_text(data: Any) -> str | None:
    """The "type: message" of a Messages error body {"type": "error", "error": {...}}."""
    if not isinstance(data, dict) or data.get("type") != "error":
        return None
    error = object_of(data.get("error"))
    kind, message = error.get("type"), error.get("message")
    return ": ".join(str(part) for part in (kind, message) if part) or "error"


def reply_from(
    blocks: list[dict[str, Any]], stop_reason: Any, usage: Any, declared: dict[str, Any]
) -> AgentReply:
    """The reply of a message's content blocks (text and tool_use; others are ignored)."""
    texts = [str(b.get("text") or "") for b in blocks if b.get("type") == "text"]
    raw_calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {
                "name": block.get("name"),
                "arguments": block["input"]
                if isinstance(block.get("input"), str)
                else json.dumps(block.get("input") or {}, ensure_ascii=False),
            },
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    calls = read_tool_calls(raw_calls or None)
    hint = declared.get("input_hint")
    text = "\n\n".join(t for t in texts if t)
    return AgentReply(
        content=text if text or not raw_calls else None,
        tool_calls=calls.calls,
        raw_tool_calls=calls.raw_items or None,
        problems=calls.problems,
        finish_reason=stop_reason if isinstance(stop_reason, str) else None,
        awaiting_input=as_bool(declared.get("awaiting_input")),
        input_hint=hint if isinstance(hint, str) else None,
        state=declared.get("state"),
        usage=usage_of(usage),
    )


def parse_message(data: Any, agent: str) -> AgentReply:
    if not isinstance(data, dict):
        raise AgentError("parse", f"agent error: {agent} replied with JSON that is not an object")
    failed = error_text(data)
    if failed is not None:
        raise AgentError("http", f"agent error: {agent}: {failed}")
    content = data.get("content")
    if not isinstance(content, list):
        raise AgentError("parse", f"agent error: {agent} reply has no content blocks")
    blocks = [block for block in content if isinstance(block, dict)]
    declared = {k: data[k] for k in ("awaiting_input", "input_hint", "state") if k in data}
    return reply_from(blocks, data.get("stop_reason"), data.get("usage"), declared)


class MessageAssembler:
    """A streamed message put together from its events."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.first_token_at: float | None = None
        # Content blocks by index: text pieces, or a tool_use's id, name and JSON pieces.
        self.blocks: dict[int, dict[str, Any]] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.done = False

    def feed(self, event: StreamEvent) -> bool:
        data = json_data(event, self.agent)
        if not isinstance(data, dict):
            raise StreamFailure(
                f"agent error: {self.agent} sent a stream event that is not an object"
            )
        kind = data.get("type") or event.name
        if kind == "error":
            error = object_of(data.get("error"))
            raise StreamFailure(
                f"agent error: {self.agent}: {error_text(data)}",
                retryable=error.get("type") in RETRYABLE_ERRORS,
                raw=event.data[:4096],
            )
        if kind == "message_start":
            message = object_of(data.get("message"))
            self._usage(message.get("usage"))
        elif kind == "content_block_start":
            self._start(data.get("index"), data.get("content_block"))
        elif kind == "content_block_delta":
            self._delta(data.get("index"), data.get("delta"))
        elif kind == "message_delta":
            delta = object_of(data.get("delta"))
            if isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
            self._usage(data.get("usage"))
        elif kind == "message_stop":
            self.done = True
            return True
        return False

    def _usage(self, usage: Any) -> None:
        # message_delta's counts are cumulative: the latest of each count wins.
        if isinstance(usage, dict):
            self.usage.update({k: v for k, v in usage.items() if v is not None})

    def _start(self, index: Any, block: Any) -> None:
        if not isinstance(index, int) or not isinstance(block, dict):
            return
        if block.get("type") == "tool_use":
            name = block.get("name")
            what = f"{self.agent}'s tool call {index}"
            if isinstance(name, str) and len(name) > TOOL_NAME.limit:
                raise over_bound(f"{what}'s name", TOOL_NAME)
            self.blocks[index] = {
                "type": "tool_use",
                "id": block.get("id"),
                "name": name,
                "parts": TextPieces(f"{what}'s arguments"),
            }
            mark_content(self)
        elif block.get("type") == "text":
            text = block.get("text") or ""
            parts = TextPieces(f"{self.agent}'s text block {index}")
            self.blocks[index] = {"type": "text", "parts": parts}
            if isinstance(text, str) and text:
                parts.add(text)
                mark_content(self)

    def _delta(self, index: Any, delta: Any) -> None:
        block = self.blocks.get(index) if isinstance(index, int) else None
        if block is None or not isinstance(delta, dict):
            return
        piece = delta.get("text") if delta.get("type") == "text_delta" else None
        if delta.get("type") == "input_json_delta":
            piece = delta.get("partial_json")
        if isinstance(piece, str) and piece:
            block["parts"].add(piece)
            mark_content(self)

    def finish(self) -> None:
        if not self.done:
            raise StreamFailure(
                f"agent error: {self.agent}'s stream ended before message_stop", retryable=True
            )

    def reply(self) -> AgentReply:
        blocks: list[dict[str, Any]] = []
        for _, block in sorted(self.blocks.items()):
            joined = block["parts"].text()
            if block["type"] == "text":
                blocks.append({"type": "text", "text": joined})
            else:
                # A tool_use block's input is the JSON its pieces make ({} for none); a
                # stream cut inside it leaves text that is not JSON, which is reported.
                tool_use = {k: v for k, v in block.items() if k != "parts"}
                blocks.append({**tool_use, "input": joined or "{}"})
        return reply_from(blocks, self.stop_reason, self.usage or None, {})
