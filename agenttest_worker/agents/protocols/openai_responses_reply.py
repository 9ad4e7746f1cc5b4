"""Reading Responses API replies: a whole `response` object, or the events of a streamed one.

The text of the `message` output items (their `output_text` and `refusal` parts) is the
reply's content, `function_call` items are its tool calls (in Chat Completions shape,
`call_id` as their id, for the conversation the engine keeps), `usage` gives the input
and output tokens, and the status the finish reason. Other output items (reasoning,
built-in tools) are not part of the reply.

A stream is `response.created` and `response.in_progress` (the response so far), then
per output item `response.output_item.added`, its pieces (`response.output_text.delta`,
`response.function_call_arguments.delta`) and `response.output_item.done` (the item
whole), then `response.completed` or `response.incomplete` with the whole response and
its usage. `response.failed` and `error` end the stream with their message; event types
the API adds later (content_part, output_text.done, ...) are passed over.
"""

from __future__ import annotations

from dataclasses import dataclass
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

# Error events worth another attempt when no content came yet.
RETRYABLE_ERRORS = frozenset({"server_error", "rate_limit_exceeded"})


@dataclass
class ResponsesReply(AgentReply):
    """A reply with the id of the response it came in (for `previous_response_id`)."""

    response_id: str | None = None


def finish_reason(status: Any, incomplete: Any, has_calls: bool) -> str | None:
    if status == "completed":
        return "tool_calls" if has_calls else "stop"
    if status == "incomplete":
        reason = object_of(incomplete).get("reason")
        if reason == "max_output_tokens":
            return "length"
        return reason if isinstance(reason, str) else "incomplete"
    return status if isinstance(status, str) else None


def usage_of(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    prompt, completion = count("input_tokens"), count("output_tokens")
    total = count("total_tokens") if "total_tokens" in usage else prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def reply_from(items: list[dict[str, Any]], response: dict[str, Any]) -> ResponsesReply:
    """The reply of a response's output items (messages and function calls; other
    items, such as reasoning, are not part of it)."""
    texts: list[str] = []
    raw_calls: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    texts.append(str(part.get("refusal") or ""))
        elif item.get("type") == "function_call":
            raw_calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
    calls = read_tool_calls(raw_calls or None)
    text = "".join(texts)
    hint = response.get("input_hint")
    response_id = response.get("id")
    return ResponsesReply(
        content=text if text or not raw_calls else None,
        tool_calls=calls.calls,
        raw_tool_calls=calls.raw_items or None,
        problems=calls.problems,
        finish_reason=finish_reason(
            response.get("status"), response.get("incomplete_details"), bool(raw_calls)
        ),
        awaiting_input=as_bool(response.get("awaiting_input")),
        input_hint=hint if isinstance(hint, str) else None,
        state=response.get("state"),
        usage=usage_of(response.get("usage")),
        response_id=response_id if isinstance(response_id, str) else None,
    )


def error_text(error: Any) -> str | None:
    """ "type: message" of an API error object {"message", "type", "param", "code"}."""
    if isinstance(error, str) and error.strip():
        return error
    if not isinstance(error, dict):
        return None
    kind, message = error.get("type") or error.get("code"), error.get("message")
    return ": ".join(str(part) for part in (kind, message) if part) or "error"


def parse_response(data: Any, agent: str) -> ResponsesReply:
    if not isinstance(data, dict):
        raise AgentError("parse", f"agent error: {agent} replied with JSON that is not an object")
    failed = error_text(data.get("error"))
    if failed is not None:
        raise AgentError("http", f"agent error: {agent}: {failed}")
    status = data.get("status")
    if status in ("queued", "in_progress", "failed", "cancelled"):
        # A background response is not waited for; the others ended without an answer.
        raise AgentError("parse", f"agent error: {agent}'s response is {status}")
    output = data.get("output")
    if not isinstance(output, list):
        raise AgentError("parse", f"agent error: {agent} reply has no output")
    return reply_from([item for item in output if isinstance(item, dict)], data)


class ResponseAssembler:
    """A streamed response put together from its events."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.first_token_at: float | None = None
        # Output items by output_index: each item as last sent, text and argument pieces.
        self.items: dict[int, dict[str, Any]] = {}
        self.pieces: dict[int, TextPieces] = {}
        self.response: dict[str, Any] = {}
        self.done = False

    def feed(self, event: StreamEvent) -> bool:
        data = json_data(event, self.agent)
        if not isinstance(data, dict):
            raise StreamFailure(
                f"agent error: {self.agent} sent a stream event that is not an object"
            )
        kind = data.get("type") or event.name
        if kind == "error":
            error = data.get("error") if isinstance(data.get("error"), dict) else data
            raise StreamFailure(
                f"agent error: {self.agent}: {error_text(error)}",
                retryable=object_of(error).get("code") in RETRYABLE_ERRORS,
                raw=event.data[:4096],
            )
        if kind in ("response.created", "response.in_progress"):
            self.response = object_of(data.get("response"))
        elif kind == "response.output_item.added":
            self._item(data, opened=True)
        elif kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            index = data.get("output_index")
            delta = data.get("delta")
            if isinstance(index, int) and isinstance(delta, str) and delta:
                pieces = self.pieces.get(index)
                if pieces is None:
                    what = f"{self.agent}'s output item {index}"
                    pieces = self.pieces[index] = TextPieces(what)
                pieces.add(delta)
                mark_content(self)
        elif kind == "response.output_item.done":
            self._item(data, opened=False)
        elif kind == "response.failed":
            response = object_of(data.get("response"))
            failed = error_text(response.get("error")) or "the response failed"
            raise StreamFailure(f"agent error: {self.agent}: {failed}", raw=event.data[:4096])
        elif kind in ("response.completed", "response.incomplete"):
            self.response = object_of(data.get("response"))
            self.done = True
            return True
        return False

    def _item(self, data: dict[str, Any], *, opened: bool) -> None:
        index, item = data.get("output_index"), data.get("item")
        if not isinstance(index, int) or not isinstance(item, dict):
            return
        name = item.get("name")
        if isinstance(name, str) and len(name) > TOOL_NAME.limit:
            raise over_bound(f"{self.agent}'s output item {index}'s name", TOOL_NAME)
        self.items[index] = item
        if not opened:
            # The item whole: its pieces are in it.
            self.pieces.pop(index, None)
        if item.get("type") == "function_call":
            mark_content(self)

    def finish(self) -> None:
        if not self.done:
            raise StreamFailure(
                f"agent error: {self.agent}'s stream ended before response.completed",
                retryable=True,
            )

    def reply(self) -> ResponsesReply:
        output = self.response.get("output") if self.done else None
        if not isinstance(output, list) or not output:
            output = [self._assembled(index) for index in sorted(self.items)]
        return reply_from([item for item in output if isinstance(item, dict)], self.response)

    def _assembled(self, index: int) -> dict[str, Any]:
        """An output item as its events made it: the item, its pieces still open."""
        item = dict(self.items[index])
        pieces = self.pieces.get(index)
        if pieces is None:
            return item
        joined = pieces.text()
        if item.get("type") == "function_call":
            item["arguments"] = joined
        elif item.get("type") == "message":
            item["content"] = [{"type": "output_text", "text": joined}]
        return item
