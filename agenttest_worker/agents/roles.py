"""Calls to the helper roles, exactly as the spec's interfaces describe them.

- simulator: the spec's example prompt (persona, goal, the conversation, the agent's last
  response) and `metadata` with test_mode "simulator", persona, goal, turn_number,
  turn_count, max_turns, last_response; returns {input, goal_achieved, reasoning}. The
  conversation goes as the simulator's agent entry says (`messages`): `transcript` (one
  user message holding it as text), `as_is` (the messages as they are: the target's words
  as the assistant's) or `swapped` (roles swapped: the simulated user is the assistant).
- validator: [user: original input, assistant: response] (or the conversation so far)
  after a system prompt, `metadata` with test_mode "validator" and the criteria;
  returns {passed, score, reason, suggestions} (tdx's evaluator: {pass, reason, plan,
  thinking}; plan and thinking are kept).
- generator: `metadata` with test_mode "generator", target_agent, count, focus and the
  other query parameters; returns {cases: [...]}.

The built-in system prompts carry the metadata too, for agents behind hosted APIs that
drop or restrict `metadata`. Replies are parsed leniently (JSON inside code fences or
prose); a reply that still does not parse is an error that keeps the raw text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agenttest_worker.agents.config import SimulatorMessages
from agenttest_worker.agents.http.transport import snippet
from agenttest_worker.agents.interface import AgentError, AgentRequest, text_of
from agenttest_worker.results import AgentCallRecord

SIMULATOR_PROMPT = """You are simulating a user with the following characteristics:

Persona: {persona}
Goal: {goal}
Turn: {turn_number} of at most {max_turns}

{conversation}

Generate the next user message to continue toward the goal.
If the goal has been achieved, set goal_achieved to true.

Respond in JSON format:
{{"input": "your response as the user", "goal_achieved": true/false,
 "reasoning": "brief explanation"}}

Test metadata: {metadata}"""

# Where the simulator's prompt says the conversation is, by `messages` mode.
_JUST_RESPONDED = 'The agent just responded:\n"{last_response}"'
SIMULATOR_CONVERSATION = {
    "transcript": "The current conversation, and the agent's last response, are in the "
    "next message.",
    "as_is": "The current conversation follows: the user's messages are yours, the "
    "assistant's are the agent's.\n\n" + _JUST_RESPONDED,
    "swapped": "The current conversation follows, seen from your side: your messages are "
    "the assistant's, the agent's are the user's.\n\n" + _JUST_RESPONDED,
}
SIMULATOR_TRANSCRIPT = "Current conversation:\n{transcript}\n\n" + _JUST_RESPONDED

VALIDATOR_PROMPT = """You are a strict evaluator of an AI agent's responses.

Criteria: {criteria}

Judge only against the criteria. Evaluate the assistant's last response{scope}.

Respond in JSON only:
{{"passed": true or false, "score": a number from 0 to 1, "reason": "why", "suggestions": ["..."]}}

Test metadata: {metadata}"""

GENERATOR_PROMPT = """You are a test case generator for AI agents.

Target Agent: {target_agent}
Description: {target_description}
Available Tools: {target_tools}

Generate {count} test cases with focus on: {focus}

For each test case, provide:
- id: Unique identifier
- name: Descriptive name
- input: User message, or turns: [{{"input": ...}}] for multi-turn
- assertions: Expected behaviors to verify

Respond in JSON only: {{"cases": [...]}}

Test metadata: {metadata}"""

T = TypeVar("T")

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


class ReplyParseError(ValueError):
    def __init__(self, message: str, raw: str) -> None:
        super().__init__(message)
        self.raw = raw


def parse_json_reply(text: str | None) -> dict[str, Any]:
    """The JSON object in a reply: the whole text, a fenced block, or the first {...} in prose."""
    raw = text or ""
    found = _find_json(raw, "{", _an_object)
    if found is None:
        raise ReplyParseError(f"reply is not JSON: {snippet(raw)}", raw)
    return found


def _an_object(value: Any, _in_prose: bool) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _find_json(text: str, openers: str, pick: Callable[[Any, bool], T | None]) -> T | None:
    """The first JSON value in a reply that `pick(value, in_prose)` makes something of:
    the whole text, then each fenced block, then each value in prose starting with one
    of `openers` (models wrap what they were asked for in fences and sentences)."""
    for candidate in (text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))):
        if not candidate.startswith(tuple(openers)):
            continue
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):  # (nested past the parser's own limit)
            continue
        if (found := pick(value, False)) is not None:
            return found
    decoder = json.JSONDecoder()
    for match in re.finditer(f"[{re.escape(openers)}]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):
            continue
        if (found := pick(value, True)) is not None:
            return found
    return None


def conversation_for_role(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """User and assistant turns as plain text: what a simulator or judge reads.

    Tool plumbing (tool messages, tool_calls) is folded into the assistant's text, so
    that a helper agent behind a strict Chat Completions API gets a valid history: the
    calls as `[tool calls: name(args)]`, each result as `[tool result name: ...]` on the
    assistant message that made the call. System messages are left out.
    """
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "tool":
            if out and out[-1]["role"] == "assistant":
                name = names.get(str(message.get("tool_call_id")), "")
                result = text_of(message.get("content")) or ""
                label = f"tool result {name}" if name else "tool result"
                out[-1]["content"] += ("\n" if out[-1]["content"] else "") + f"[{label}: {result}]"
            continue
        if role not in ("user", "assistant"):
            continue
        text = text_of(message.get("content")) or ""
        raw_calls = message.get("tool_calls")
        if role == "assistant" and isinstance(raw_calls, list) and raw_calls:
            shown = []
            for call in raw_calls:
                if not isinstance(call, dict):
                    continue
                function = call.get("function")
                function = function if isinstance(function, dict) else {}
                name = str(function.get("name"))
                if call.get("id") is not None:
                    names[str(call["id"])] = name
                shown.append(f"{name}({function.get('arguments', '')})")
            text = (text + "\n" if text else "") + f"[tool calls: {', '.join(shown)}]"
        out.append({"role": role, "content": text})
    return out


def _meta_text(metadata: dict[str, Any]) -> str:
    return json.dumps(metadata, ensure_ascii=False, default=str)


@dataclass
class SimulatorTurn:
    input: str
    goal_achieved: bool
    reasoning: str | None
    # The simulator says it left its persona (`"left_persona": true` in its reply): the
    # conversation no longer tests what the case meant.
    left_persona: bool = False


def transcript_of(messages: list[dict[str, Any]]) -> str:
    """The conversation as text, one paragraph a message: "User: ..." and "Agent: ..."
    (tool calls and their results folded into the agent's, as `conversation_for_role`)."""
    names = {"user": "User", "assistant": "Agent"}
    folded = conversation_for_role(messages)
    return "\n\n".join(f"{names[m['role']]}: {m['content']}" for m in folded)


def _swapped(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    swap = {"user": "assistant", "assistant": "user"}
    return [{**m, "role": swap[m["role"]]} for m in messages]


def last_response_of(messages: list[dict[str, Any]]) -> str:
    """The text of the conversation's last assistant message ("" when there is none)."""
    for message in reversed(conversation_for_role(messages)):
        if message["role"] == "assistant":
            return str(message["content"])
    return ""


def simulator_request(
    history: list[dict[str, Any]],
    metadata: dict[str, Any],
    session_id: str | None,
    case_id: str,
    turn: int,
    messages: SimulatorMessages = "transcript",
) -> AgentRequest:
    last = metadata.get("last_response")
    last_response = last if isinstance(last, str) else last_response_of(history)
    system = SIMULATOR_PROMPT.format(
        persona=metadata.get("persona", "a typical user"),
        goal=metadata.get("goal", "get the agent to complete the task"),
        turn_number=metadata.get("turn_number"),
        max_turns=metadata.get("max_turns"),
        conversation=SIMULATOR_CONVERSATION[messages].format(last_response=last_response),
        metadata=_meta_text(metadata),
    )
    if messages == "transcript":
        text = SIMULATOR_TRANSCRIPT.format(
            transcript=transcript_of(history), last_response=last_response
        )
        conversation = [{"role": "user", "content": text}]
    elif messages == "swapped":
        conversation = _swapped(conversation_for_role(history))
    else:
        conversation = conversation_for_role(history)
    return AgentRequest(
        role="simulator",
        messages=[{"role": "system", "content": system}, *conversation],
        metadata=metadata,
        session_id=session_id,
        case_id=case_id,
        turn=turn,
    )


def read_simulator_reply(content: str | None) -> SimulatorTurn:
    data = parse_json_reply(content)
    goal = data.get("goal_achieved", False)
    goal_achieved = goal is True or (isinstance(goal, str) and goal.lower() == "true")
    text = data.get("input")
    if text is None and not goal_achieved:
        raise ReplyParseError("reply has no `input`", content or "")
    if text is not None and not isinstance(text, str):
        text = json.dumps(text) if not isinstance(text, int | float) else str(text)
    if not goal_achieved and not (text or "").strip():
        raise ReplyParseError(
            "reply has an empty `input` and the goal is not achieved", content or ""
        )
    reasoning = data.get("reasoning")
    return SimulatorTurn(
        text or "",
        goal_achieved,
        reasoning if isinstance(reasoning, str) else None,
        left_persona=data.get("left_persona") is True,
    )


def validator_request(
    messages: list[dict[str, Any]], metadata: dict[str, Any], whole_conversation: bool
) -> AgentRequest:
    system = VALIDATOR_PROMPT.format(
        criteria=metadata.get("criteria", "(none given)"),
        scope=" in the context of the whole conversation" if whole_conversation else "",
        metadata=_meta_text(metadata),
    )
    return AgentRequest(
        role="validator",
        messages=[{"role": "system", "content": system}, *conversation_for_role(messages)],
        metadata=metadata,
    )


# How much of a judge's prompt and reply a record keeps (each).
JUDGE_TEXT_LIMIT = 20_000


def bounded(text: str | None, limit: int = JUDGE_TEXT_LIMIT) -> str | None:
    """`text` cut to `limit` characters, saying how much was left out."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit} more characters not kept)"


def judge_prompt(messages: list[dict[str, Any]]) -> str | None:
    """A judge's messages as one text: each under its role, as the judge read them."""
    parts = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        parts.append(f"[{message.get('role', '?')}]\n{text}")
    return bounded("\n\n".join(parts))


@dataclass
class Verdict:
    passed: bool
    reason: str
    score: float | None
    suggestions: list[str] | None
    # tdx's evaluator returns its plan and its thinking beside its verdict and reason.
    plan: str | None = None
    thinking: str | None = None


def read_validator_reply(content: str | None) -> Verdict:
    data = parse_json_reply(content)
    raw_passed = data.get("passed", data.get("pass", data.get("result")))
    passed: bool | None = None
    if isinstance(raw_passed, bool):
        passed = raw_passed
    elif isinstance(raw_passed, str) and raw_passed.strip().lower() in (
        "pass",
        "passed",
        "true",
        "fail",
        "failed",
        "false",
    ):
        passed = raw_passed.strip().lower() in ("pass", "passed", "true")
    if passed is None:
        raise ReplyParseError("judge reply has no `passed` verdict", content or "")
    score = data.get("score")
    reason = data.get("reason") or data.get("reasoning") or ""
    suggestions = data.get("suggestions")
    return Verdict(
        passed=passed,
        reason=str(reason),
        score=_number(score),
        suggestions=[str(s) for s in suggestions] if isinstance(suggestions, list) else None,
        plan=_text(data.get("plan")),
        thinking=_text(data.get("thinking")),
    )


def _text(value: Any) -> str | None:
    """A judge's free-text field as text (a list or object written as JSON); None when
    it is absent or empty."""
    if value is None or value == "" or value == [] or value == {}:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _number(value: Any) -> float | None:
    """A judge's score: a number, or a number written as text ("0.7")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def generator_request(metadata: dict[str, Any]) -> AgentRequest:
    system = GENERATOR_PROMPT.format(
        target_agent=metadata.get("target_agent"),
        target_description=metadata.get("target_description") or "(not described)",
        target_tools=json.dumps(metadata.get("target_tools") or [], default=str),
        count=metadata.get("count", "some"),
        focus=metadata.get("focus", "happy-path"),
        metadata=_meta_text(metadata),
    )
    return AgentRequest(
        role="generator",
        messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": "Generate the test cases now."},
        ],
        metadata=metadata,
    )


def read_generator_reply(content: str | None) -> list[Any]:
    """The generated cases: a JSON array of them (the spec's generator prompt asks for
    one) or {"cases": [...]}, as the whole reply, in a code fence, or in prose."""
    text = content or ""
    cases = _find_json(text, "[{", _generated_cases)
    if cases is None:
        raise ReplyParseError("generator reply has no `cases` list", text)
    return cases


def _generated_cases(value: Any, in_prose: bool) -> list[Any] | None:
    cases = _cases_of(value)
    # In prose, a list counts only when it holds objects: "[3]" is not cases.
    if cases is not None and in_prose and isinstance(value, list) and not _all_objects(value):
        return None
    return cases


def _cases_of(value: Any) -> list[Any] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and isinstance(value.get("cases"), list):
        cases: list[Any] = value["cases"]
        return cases
    return None


def _all_objects(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, dict) for v in values)


def parse_failure(
    role: str, agent: str, exc: ReplyParseError, call: AgentCallRecord | None
) -> AgentError:
    message = f"{role} {agent}: {exc}"
    raw = exc.raw[:4096]
    if call is not None:
        if call.error is None:
            call.error = message  # the call itself went through; its reply is what failed
        call.reply = raw  # kept, as DESIGN's role calls say, to see what came back
    return AgentError("parse", message, call=call, raw=raw)
