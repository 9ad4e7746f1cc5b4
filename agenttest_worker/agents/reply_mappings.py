"""Where an http agent's JSON keeps what agenttest reads: its reply's fields
(`response:`), and the events of its chat history (`history:`), as JSONPaths."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agenttest_worker.agents.http.urls import url_problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResponseMapping(_Strict):
    """JSONPaths that pick a generic http agent's reply fields out of its response body.

    A streamed reply (`stream: sse|ndjson`) is read event by event: `content_delta`
    picks the piece of text each event adds, `final` marks the last event (where it
    finds a value other than false or null), and the other paths read that last event.
    """

    content: str = "$.content"
    tool_calls: str = "$.tool_calls"
    awaiting_input: str = "$.awaiting_input"
    input_hint: str = "$.input_hint"
    state: str = "$.state"
    # Why the reply stopped; `length` or `max_tokens` (cut off) awaits no input.
    finish_reason: str = "$.finish_reason"
    content_delta: str = "$.delta"
    final: str | None = None


class HistoryMapping(_Strict):
    """Where a chat history keeps its events, and how each says who it came from.

    By role (the default): events whose role is `input_role` are the inputs the history
    is split at; events with `tool_calls` are tool calls (Chat Completions items or
    {name, args}); events whose role is `tool_role` are tool results, named by
    `tool_name` or by the call whose id their `tool_call_id` answers.

    By key (tdx's history, `{"data": [{"input"}, {"content"}, {"tool": {...}}]}`): when
    `input` or `tool` is set, events carry no role and are told apart by which of these
    paths finds something in them: `input` marks an input, `tool` a tool event (a call
    and its result: `tool_name`, `tool_args`, `tool_content`), and any other event with
    `content` (or `tool_calls`) is the agent's.
    """

    events: str = "$.messages"
    role: str = "$.role"
    content: str = "$.content"
    tool_calls: str = "$.tool_calls"
    tool_name: str = "$.name"
    tool_call_id: str = "$.tool_call_id"
    input_role: str = "user"
    assistant_role: str = "assistant"
    tool_role: str = "tool"
    input: str | None = None
    tool: str | None = None
    # A tool event's arguments and result (None: no arguments; the result at `content`).
    tool_args: str | None = None
    tool_content: str | None = None

    @property
    def by_key(self) -> bool:
        return self.input is not None or self.tool is not None


class HistoryConfig(_Strict):
    """An agent whose replies are read back from its chat history (as tdx does): after
    every turn (`when: turn`) or once after the last static turn (`when: end`), the
    runner fetches `url` ({{session_id}} and {{case_id}} filled in) and gives each turn
    what the agent emitted after its input."""

    url: str
    method: Literal["GET", "POST"] = "GET"
    when: Literal["turn", "end"] = "turn"
    headers: dict[str, str] = Field(default_factory=dict)
    response: HistoryMapping = Field(default_factory=HistoryMapping)

    @field_validator("url")
    @classmethod
    def _callable_url(cls, url: str) -> str:
        # Placeholders are filled in at call time; checked as the URL they will be.
        problem = url_problem(re.sub(r"\{\{\s*[a-z_]+\s*\}\}", "x", url))
        if problem:
            raise ValueError(problem)
        return url
