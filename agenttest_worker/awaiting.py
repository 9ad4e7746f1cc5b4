"""Is the agent waiting for the user? (the spec's hybrid detection, DESIGN.md decision 2)

In priority:
1. the agent's explicit `awaiting_input` (true or false: an agent that declares its
   state is believed);
2. a tool call named in the awaiting tools (request_confirmation, ask_user,
   get_user_input by default; `awaiting_tools` in agenttest.yaml);
3. content heuristics, per sentence: a sentence ending in "?", or starting with
   what/how/when/where/which/who/please/could you/can you/would you (and shall I,
   do you, may I), or asking to confirm/verify/proceed/continue.
A reply that only calls tools is not awaiting input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from agenttest_worker.results import ToolCall

AGENT_DECLARED = "agent_declared"
AGENT_DECLARED_DONE = "agent_declared_complete"
TOOL_REQUIRES_INPUT = "tool_requires_confirmation"
CONTENT_IS_QUESTION = "content_is_question"
COMPLETED = "completed"

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?。？！])\s+|\n+")
# Markdown and quoting around a sentence do not change what it asks.
_DECORATION = " \t*_`>\"'()[]-•·:"
_QUESTION_START = re.compile(
    r"^(?:what|how|when|where|which|who|please|could you|can you|would you|shall i|shall we"
    r"|do you|may i)\b",
    re.IGNORECASE,
)
_ASKS_TO_CONFIRM = re.compile(
    r"^(?:kindly\s+)?(?:confirm|verify)\b"
    r"|\b(?:let me know|tell me|reply|respond|type|say|click)\b"
    r".*\b(?:confirm|verify|proceed|continue)\b"
    r"|\b(?:confirm|verify|proceed|continue)\s*[?:]",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Awaiting:
    awaiting: bool
    reason: str


def sentences(text: str) -> list[str]:
    out = []
    for raw in _SENTENCE_SPLIT.split(text):
        sentence = raw.strip(_DECORATION)
        if sentence:
            out.append(sentence)
    return out


def looks_like_question(text: str | None) -> bool:
    if not text:
        return False
    for sentence in sentences(text):
        if sentence.endswith(("?", "？")):
            return True
        if _QUESTION_START.match(sentence) or _ASKS_TO_CONFIRM.search(sentence):
            return True
    return False


def detect_awaiting(
    content: str | None,
    tool_calls: Iterable[ToolCall],
    declared: bool | None,
    awaiting_tools: Iterable[str],
) -> Awaiting:
    if declared is not None:
        return Awaiting(declared, AGENT_DECLARED if declared else AGENT_DECLARED_DONE)
    calls = list(tool_calls)
    wanted = set(awaiting_tools)
    if any(call.name in wanted for call in calls):
        return Awaiting(True, TOOL_REQUIRES_INPUT)
    if looks_like_question(content):
        return Awaiting(True, CONTENT_IS_QUESTION)
    return Awaiting(False, COMPLETED)
