"""Is the agent waiting for the user? (the spec's hybrid detection, DESIGN.md decision 2)

In priority:
1. the agent's explicit `awaiting_input` (true or false: an agent that declares its
   state is believed);
   then the reply's finish reason (the spec's strategy 2): a reply cut off by its length
   (`length`, Anthropic's `max_tokens`) awaits nothing, whatever it ends with: its last
   sentence is where the tokens ran out, not a question;
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
RESPONSE_TRUNCATED = "response_truncated"
# How providers say a reply was cut off at its token limit (Chat Completions, Messages).
TRUNCATED_FINISH_REASONS = frozenset({"length", "max_tokens"})

# A sentence ends at . ! ? (and closing quotes, brackets or markdown emphasis right after
# them, as in "**Is this correct?** Reply yes.") followed by whitespace, at a CJK full
# stop or question mark, or at a line break.
# (The lookahead first: every alternative starts with one of its characters, and the
# scan skips to them instead of trying each alternative at every position.)
_SENTENCE_END = re.compile(r"(?=[.!?。？！\n])(?:([.!?][\"'”’)\]*_`]*)(?=\s|$)|([。？！])|\n+)")
# Markdown and quoting around a sentence do not change what it asks.
_DECORATION = " \t*_`>\"'()[]-•·:"
_QUESTION_START = re.compile(
    r"^(?:what|how|when|where|which|who|please|could you|can you|would you|shall i|shall we"
    r"|do you|may i)\b",
    re.IGNORECASE,
)
# "Confirm the amount." / "Verify your details." (imperative), or "... proceed?".
_CONFIRM_REQUEST = re.compile(
    r"^(?:kindly\s+)?(?:confirm|verify)\b|\b(?:confirm|verify|proceed|continue)\s*\?",
    re.IGNORECASE,
)
# An instruction to the user to answer ("let me know", "reply YES", "type CONFIRM"),
# at the start of the sentence or clause or after please/just/then: "I'll reply to the
# vendor and continue" is a statement, "If you want to proceed, reply YES" a request.
_ANSWER_INSTRUCTION = re.compile(
    r"(?:^|[,;:]\s*|\b(?:please|kindly|just|simply|then)\s+)"
    r"(?:let me know|tell me|reply|respond|answer|type|say|click|write)\b",
    re.IGNORECASE,
)
_CONFIRM_WORDS = ("confirm", "verify", "proceed", "continue")
_CONFIRM_WORD = re.compile(rf"\b(?:{'|'.join(_CONFIRM_WORDS)})\b", re.IGNORECASE)
# Every way of asking to confirm above needs one of these words: a reply without any is
# looked at once, not searched sentence by sentence (benchmarks/RESULTS.md: most of the
# detection's time on a long reply).
_CONFIRM_ANYWHERE = re.compile("|".join(_CONFIRM_WORDS), re.IGNORECASE)


@dataclass(frozen=True)
class Awaiting:
    awaiting: bool
    reason: str


def sentences(text: str) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.end() if match.group(1) or match.group(2) else match.start()
        pieces.append(text[start:end])
        start = match.end()
    pieces.append(text[start:])
    out = []
    for raw in pieces:
        sentence = raw.strip(_DECORATION)
        if sentence:
            out.append(sentence)
    return out


def asks_to_confirm(sentence: str) -> bool:
    if _CONFIRM_REQUEST.search(sentence):
        return True
    return bool(_ANSWER_INSTRUCTION.search(sentence) and _CONFIRM_WORD.search(sentence))


def _may_ask_to_confirm(text: str) -> bool:
    """Whether `text` holds a word `asks_to_confirm` needs, as its patterns match it."""
    if text.isascii():  # then lower() folds exactly what IGNORECASE does
        lowered = text.lower()
        return any(word in lowered for word in _CONFIRM_WORDS)
    return _CONFIRM_ANYWHERE.search(text) is not None


def looks_like_question(text: str | None) -> bool:
    if not text:
        return False
    may_confirm = _may_ask_to_confirm(text)
    for sentence in sentences(text):
        if sentence.endswith(("?", "？")):
            return True
        if _QUESTION_START.match(sentence) or (may_confirm and asks_to_confirm(sentence)):
            return True
    return False


def detect_awaiting(
    content: str | None,
    tool_calls: Iterable[ToolCall],
    declared: bool | None,
    awaiting_tools: Iterable[str],
    finish_reason: str | None = None,
) -> Awaiting:
    if declared is not None:
        return Awaiting(declared, AGENT_DECLARED if declared else AGENT_DECLARED_DONE)
    if finish_reason is not None and finish_reason.lower() in TRUNCATED_FINISH_REASONS:
        return Awaiting(False, RESPONSE_TRUNCATED)
    calls = list(tool_calls)
    wanted = set(awaiting_tools)
    if any(call.name in wanted for call in calls):
        return Awaiting(True, TOOL_REQUIRES_INPUT)
    if looks_like_question(content):
        return Awaiting(True, CONTENT_IS_QUESTION)
    return Awaiting(False, COMPLETED)
