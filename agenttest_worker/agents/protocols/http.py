"""The `http` protocol: any JSON endpoint, described by a request template and reply paths.

The request body is `request` from agenttest.yaml with placeholders filled in. A string
that is exactly "{{name}}" becomes the value itself (a list, an object); inside longer
strings a placeholder becomes text. Placeholders: input (the last user message),
messages (the Chat Completions history), metadata, options (the case's skip, search and
mode; {} when none is set), session_id, case_id, turn, role, attachments ([{type,
source, name}]). Without a template the body is {"input", "messages", "metadata",
"session_id", "attachments"}, and "options" beside "metadata" when any is set.

Reply fields are read with the JSONPaths under `response` (content, tool_calls,
awaiting_input, input_hint, state). An agent that answers in the spec's explicit
declaration shape {"content", "awaiting_input", "input_hint"} needs no mapping.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agenttest_worker.agents.base import (
    AgentReply,
    AgentRequest,
    protocol,
    read_tool_calls,
    text_of,
)
from agenttest_worker.agents.config import AgentConfig, ProjectConfig, ResponseMapping
from agenttest_worker.agents.protocols.json_client import JsonAgentClient, as_bool, usage_from
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
    calls = read_tool_calls(_first(mapping.tool_calls, data))
    return AgentReply(
        content=content,
        tool_calls=calls.calls,
        problems=calls.problems,
        awaiting_input=as_bool(_first(mapping.awaiting_input, data)),
        input_hint=hint if isinstance(hint, str) else None,
        state=_first(mapping.state, data),
        finish_reason=None,
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
    return None if config.url or config.base_url else "an http agent needs url"


@protocol("http", check=needs_url)
class HttpAgentClient(JsonAgentClient):
    def __init__(
        self, name: str, config: AgentConfig, project: ProjectConfig | None = None
    ) -> None:
        super().__init__(name, config, project)
        self.template = config.request if config.request is not None else DEFAULT_TEMPLATE

    def body(self, request: AgentRequest) -> Any:
        metadata = request.metadata if self.config.metadata != "none" else {}
        values = {
            "input": last_user_text(request.messages),
            "messages": request.messages,
            "metadata": metadata,
            "options": request.options,
            "session_id": request.session_id,
            "case_id": request.case_id,
            "turn": request.turn,
            "role": request.role,
            "attachments": attachments_of(request.messages),
        }
        body = render(self.template, values)
        if self.template is DEFAULT_TEMPLATE and request.options:
            # Left out when empty, so the default body stays as it was for cases that
            # set no options (the spec's Go struct writes them `omitempty`).
            body["options"] = request.options
        return body

    def parse(self, data: Any) -> AgentReply:
        return parse_http_reply(data, self.config.response)
