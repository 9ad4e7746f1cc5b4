"""`local.assistant` in agenttest.yaml: an agent written as a Python function.

respond(messages, metadata) gets the conversation as Chat Completions messages and
returns the reply text (or {"content", "tool_calls", "awaiting_input", "input_hint",
"state"}). This one greets, and remembers the name a user gave earlier in the
conversation: the tdx spec's "context memory" example.
"""

from __future__ import annotations

import re
from typing import Any

_NAME_GIVEN = re.compile(r"\bmy name is (\w+)", re.IGNORECASE)
_NAME_ASKED = re.compile(r"\bwhat'?s my name\b|\bwhat is my name\b", re.IGNORECASE)


def respond(messages: list[dict[str, Any]], metadata: dict[str, Any]) -> dict[str, Any]:
    said = [_text(m) for m in messages if m.get("role") == "user"]
    last = said[-1] if said else ""
    # The latest name wins: a user may correct it.
    names = [m.group(1) for text in said if (m := _NAME_GIVEN.search(text))]
    if _NAME_ASKED.search(last):
        content = f"Your name is {names[-1]}." if names else "You have not told me your name."
    elif _NAME_GIVEN.search(last):
        content = f"Nice to meet you, {names[-1]}."
    else:
        content = "Hello! I am a local assistant."
    # Said explicitly, so no question-like wording is ever taken as awaiting input.
    return {"content": content, "awaiting_input": False}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""
