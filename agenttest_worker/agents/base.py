"""The agent extension point: a request, a reply, an error, and the client protocol.

Every protocol (openai, http, script) turns an AgentRequest into an AgentReply or
raises AgentError; retries, timing and token accounting are common to all of them.
Messages are Chat Completions messages (role, content, tool_calls, tool_call_id),
the one shape the engine keeps for a conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from agenttest_worker.results import AgentCallRecord, AgentRole, ToolCall, Usage


@dataclass
class AgentRequest:
    role: AgentRole
    messages: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)
    # Identifies the conversation to agents that keep their own state.
    session_id: str | None = None
    case_id: str | None = None
    turn: int | None = None


@dataclass
class AgentReply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    # What the agent declared about itself (generic http agents, or extra fields).
    awaiting_input: bool | None = None
    input_hint: str | None = None
    state: Any = None
    usage: Usage | None = None
    call: AgentCallRecord | None = None
    raw_tool_calls: list[dict[str, Any]] | None = None

    def assistant_message(self) -> dict[str, Any]:
        """The reply as the assistant message that goes into the conversation history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.raw_tool_calls or [
                {
                    "id": call.id or f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.args
                        if isinstance(call.args, str)
                        else json.dumps(call.args),
                    },
                }
                for i, call in enumerate(self.tool_calls)
            ]
        return message


class AgentError(Exception):
    """A call that failed after its retries, with a message fit for the report.

    `kind` is one of: timeout, connection, http, parse, config, script.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        call: AgentCallRecord | None = None,
        raw: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.call = call
        self.raw = raw

    def __str__(self) -> str:
        return self.message


class AgentClient(Protocol):
    """One configured agent, callable with a request."""

    name: str

    async def complete(self, request: AgentRequest) -> AgentReply: ...


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as data: JSON strings are parsed; unparseable text is kept as is."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}


def tool_calls_from(raw: Any) -> list[ToolCall]:
    """ToolCalls from Chat Completions `tool_calls` (or a simpler [{name, args}] list)."""
    calls: list[ToolCall] = []
    if not isinstance(raw, list):
        return calls
    for item in raw:
        if not isinstance(item, dict):
            continue
        function = item.get("function") if isinstance(item.get("function"), dict) else None
        name = (function or item).get("name")
        if not isinstance(name, str):
            continue
        args = (
            (function or {}).get("arguments")
            if function
            else item.get("args", item.get("arguments"))
        )
        call_id = item.get("id")
        calls.append(
            ToolCall(name=name, args=parse_arguments(args), id=str(call_id) if call_id else None)
        )
    return calls


def text_of(content: Any) -> str | None:
    """The text of a message content: a string, or the text parts of a parts list."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "output_text")
        ]
        return "".join(texts)
    return str(content)
