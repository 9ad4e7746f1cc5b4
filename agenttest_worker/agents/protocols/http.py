"""The `http` protocol: any JSON endpoint, described by a request template and reply paths.

The request body is `request` from agenttest.yaml with placeholders filled in. A string
that is exactly "{{name}}" becomes the value itself (a list, an object); inside longer
strings a placeholder becomes text. Placeholders: input (the last user message),
messages (the Chat Completions history), metadata, options (the case's skip, search and
mode; {} when none is set), params (the model parameters, {} when none), session_id,
case_id, turn, role, attachments ([{type, source, name}]). Without a template the body
is {"input", "messages", "metadata", "session_id", "attachments"}, "options" beside
"metadata" when any is set, and each of `params` as a key of its own. `metadata: none`
sends neither metadata nor options.

Reply fields are read with the JSONPaths under `response` (content, tool_calls,
awaiting_input, input_hint, state). An agent that answers in the spec's explicit
declaration shape {"content", "awaiting_input", "input_hint"} needs no mapping.

`stream: sse` or `stream: ndjson` reads the reply as JSON events: `content_delta` picks
each event's piece of text, `final` marks the last event, whose other fields the other
paths read (tool calls, awaiting_input, state, usage). Without `final` the body's end
ends the reply, and the last event is read for those fields.

`history:` makes the agent history-based (protocols/chat_history.py): its replies are read
back from its chat history.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.http.streaming import (
    StreamEvent,
    StreamFailure,
    StreamSpec,
    TextPieces,
    json_data,
    mark_content,
)
from agenttest_worker.agents.http.transport import masked
from agenttest_worker.agents.interface import (
    AgentError,
    AgentReply,
    AgentRequest,
    HistoryRead,
    protocol,
    read_tool_calls,
    text_of,
)
from agenttest_worker.agents.protocols.chat_history import fetch_history
from agenttest_worker.agents.protocols.json_client import JsonAgentClient, as_bool, usage_from
from agenttest_worker.agents.reply_mappings import ResponseMapping
from agenttest_worker.agents.secret_masking import mask_error, mask_history
from agenttest_worker.json_values import find

DEFAULT_TEMPLATE: dict[str, Any] = {
    "input": "{{input}}",
    "messages": "{{messages}}",
    "metadata": "{{metadata}}",
    "session_id": "{{session_id}}",
    "attachments": "{{attachments}}",
}
# Where content is looked for when the default `$.content` finds nothing.
_CONTENT_FALLBACKS = ("$.output", "$.reply", "$.response", "$.message", "$.text", "$.answer")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return text_of(message.get("content")) or ""
    return ""


def attachments_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Non-text parts of the last user message, as {type, source, name}."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            return []
        found = []
        for part in content:
            if part.get("type") == "image_url":
                found.append({"type": "image", "source": part["image_url"]["url"]})
            elif part.get("type") == "file":
                file = part.get("file", {})
                found.append(
                    {"type": "file", "source": file.get("file_data"), "name": file.get("filename")}
                )
        return found
    return []


def render(template: Any, values: dict[str, Any]) -> Any:
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template.strip())
        if whole and whole.group(1) in values:
            return values[whole.group(1)]

        def sub(match: re.Match[str]) -> str:
            if match.group(1) not in values:
                return match.group(0)
            value = values[match.group(1)]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

        return _PLACEHOLDER.sub(sub, template)
    if isinstance(template, dict):
        return {k: render(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [render(v, values) for v in template]
    return template


def _first(path: str, data: Any) -> Any:
    found = find(path, data)
    return found[0] if found else None


def parse_http_reply(data: Any, mapping: ResponseMapping) -> AgentReply:
    if isinstance(data, str):
        return AgentReply(content=data)
    content: Any = _first(mapping.content, data)
    if content is None and mapping.content == ResponseMapping().content:
        for path in _CONTENT_FALLBACKS:
            content = _first(path, data)
            if content is not None:
                break
    if content is not None and not isinstance(content, str):
        content = _content_text(content)
    hint = _first(mapping.input_hint, data)
    finish = _first(mapping.finish_reason, data)
    calls = read_tool_calls(_first(mapping.tool_calls, data))
    return AgentReply(
        content=content,
        tool_calls=calls.calls,
        problems=calls.problems,
        awaiting_input=as_bool(_first(mapping.awaiting_input, data)),
        input_hint=hint if isinstance(hint, str) else None,
        state=_first(mapping.state, data),
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage_from(data.get("usage")) if isinstance(data, dict) else None,
    )


def _content_text(content: Any) -> str:
    """Non-string content as text: the text of Chat Completions content parts, else JSON."""
    if (
        isinstance(content, list)
        and content
        and all(isinstance(part, dict) and isinstance(part.get("type"), str) for part in content)
    ):
        return text_of(content) or ""
    # ensure_ascii=False: assertions look for "café", not "caf\u00e9".
    return json.dumps(content, ensure_ascii=False)


def needs_url(config: AgentConfig) -> str | None:
    if not (config.url or config.base_url):
        return "an http agent needs url"
    if config.stream is True:
        return "an http agent streams as stream: sse or stream: ndjson"
    return None


class EventAssembler:
    """An http agent's streamed reply: text pieces joined, the final event read."""

    def __init__(self, agent: str, mapping: ResponseMapping) -> None:
        self.agent = agent
        self.mapping = mapping
        self.first_token_at: float | None = None
        self.parts = TextPieces(f"{agent}'s reply")
        self.last: Any = None
        self.done = False

    def feed(self, event: StreamEvent) -> bool:
        if event.data.strip() == "[DONE]":
            self.done = True
            return True
        data = json_data(event, self.agent)
        self.last = data
        delta = _first(self.mapping.content_delta, data)
        if isinstance(delta, str) and delta:
            self.parts.add(delta)
            mark_content(self)
        if self.mapping.final is not None:
            marker = _first(self.mapping.final, data)
            if marker is not None and marker is not False:
                self.done = True
                return True
        return False

    def finish(self) -> None:
        if self.mapping.final is not None and not self.done:
            raise StreamFailure(
                f"agent error: {self.agent}'s stream ended before its final event "
                f"({self.mapping.final})",
                retryable=True,
            )

    def reply(self) -> AgentReply:
        last = self.last if isinstance(self.last, dict) else {}
        reply = parse_http_reply(last, self.mapping)
        # The pieces are the content; a final event's own content counts when none came.
        if self.parts:
            reply.content = self.parts.text()
        # The final event's own finish_reason, else "stop" for a stream that ended.
        if reply.finish_reason is None and self.done:
            reply.finish_reason = "stop"
        return reply


@protocol("http", check=needs_url, metadata="object")
class HttpAgentClient(JsonAgentClient):
    def __init__(
        self, name: str, config: AgentConfig, project: ProjectConfig | None = None
    ) -> None:
        super().__init__(name, config, project)
        self.template = config.request if config.request is not None else DEFAULT_TEMPLATE
        if config.history is not None:
            # Read by the engine (agents/interface.py history_source): this agent's replies
            # come from its chat history.
            self.history_when = config.history.when

    def body(self, request: AgentRequest) -> Any:
        sends = self.sends_metadata()
        metadata = request.metadata if sends else {}
        options = request.options if sends else {}
        params = self.params(request)
        values = {
            "input": last_user_text(request.messages),
            "messages": request.messages,
            "metadata": metadata,
            "options": options,
            "params": params,
            "session_id": request.session_id,
            "case_id": request.case_id,
            "turn": request.turn,
            "role": request.role,
            "attachments": attachments_of(request.messages),
        }
        body = render(self.template, values)
        if self.template is DEFAULT_TEMPLATE:
            # Left out when empty, so the default body stays as it was for cases that
            # set no options (the spec's Go struct writes them `omitempty`); params are
            # the body's own keys, as a provider names them.
            if options:
                body["options"] = options
            body.update(params)
        return body

    def parse(self, data: Any) -> AgentReply:
        return parse_http_reply(data, self.config.response)

    def stream_spec(self) -> StreamSpec | None:
        framing = self.config.stream
        if framing != "sse" and framing != "ndjson":
            return None
        return StreamSpec(framing, lambda: EventAssembler(self.name, self.config.response))

    async def fetch_history(self, request: AgentRequest) -> HistoryRead:
        assert self.config.history is not None
        if self.route_problem is not None:
            raise AgentError("config", self.route_problem)
        hidden = self.hidden()
        try:
            read = await fetch_history(self.name, self.config, request, hidden, self.route)
        except AgentError as error:
            # A history that cannot be read is kept in the error, as it came.
            raise mask_error(masked(error, hidden), hidden) from None
        return mask_history(read, hidden)
