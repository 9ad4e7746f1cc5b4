"""Model "expense": a scripted expense reimbursement assistant with a client-side tool.

It is stateless: every answer is derived from the request's `messages`, so a runner can
replay any conversation. It never executes its tool; it asks the client to call
`create_expense` and reads the result from a later `tool` message.

If the LAST message is a `tool` message (the result of its `create_expense` call):
    "I've prepared expense {id} for ${amount} ({type}). Shall I submit it? Please confirm."
    `id` is the result's JSON field "id"; when the result is not JSON, has no "id", or
    has a "status" starting with "not executed", it is "EXP-DRAFT". `amount` and `type`
    come from the arguments of the tool call the message answers (matched by
    `tool_call_id`, else the latest `create_expense` call).

Otherwise the rules read the last `user` message, first match wins:
  a. PO number (regex `PO-?\\d+`, any case): when an amount ($...) was given in this or an
     earlier user message, behave as (c) with the most recent such amount and the type
     detected from that message; else
     "Thanks, PO {PO} recorded. What type of expense would you like to submit?"
     ({PO} as written, upper-cased).
  b. yes / confirm / confirmed / proceed / ok / okay (whole words), when an earlier
     assistant message asked to confirm (its text contains "confirm") or called
     `create_expense` (a draft always awaits confirmation, as in the spec's T001):
     "Expense submitted. Reference: EXP-2025-001", with two top-level fields next to
     "choices":
       "state": {"expense": {"status": "submitted", "reference": "EXP-2025-001",
                             "amount": <number>, "type": <str>}}
       "awaiting_input": false
     amount/type come from the latest `create_expense` call, else the latest amount a
     user gave (0 and "other" when there is none).
  c. an amount (regex `\\$\\s?([\\d,]+(?:\\.\\d+)?)`, the first one in the message; commas
     are thousands separators):
     - amount >= 10000 and no PO number in any user message:
       "This requires manager approval. Please provide PO number."
     - otherwise a tool call (content null, finish_reason "tool_calls") to
       `create_expense` with arguments {"amount": <int if whole, else float>,
       "type": <type>, "description": <the user message text>} and id "call_{n}",
       n = 1 + the number of tool calls already in the conversation.
       type: "travel" if the text contains travel/flight/hotel/trip, else "meals" for
       dinner/lunch/meal, else "equipment" for equipment/laptop, else "other".
  e. an `image_url` content part:
     "I received your receipt image ({n} bytes). What is the amount?"
     n = decoded byte length of the first image's `data:` URL (0 for other URLs).
  d. mentions expense / reimburs(e) / submit: "What type of expense would you like to submit?"
  f. anything else, or no user message at all:
     "Hello! I can help you submit expense reports." (no question: not awaiting input)

Text matching is case-insensitive; message content may be a string or content parts.
`metadata` is ignored except `"locale": "fr"`, which prefixes every text reply (not tool
calls) with "[fr] ". `tools` in the request are ignored: the tool is built in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.demo._protocol import (
    JSONObject,
    completion,
    data_url_size,
    image_urls,
    message_text,
    messages_of,
    metadata_of,
    tool_call,
    tool_calls_of,
)

MODEL = "expense"
TOOL_NAME = "create_expense"
REFERENCE = "EXP-2025-001"
DRAFT_ID = "EXP-DRAFT"
# Expenses from this amount on need a PO number (the spec's T002 "manager approval").
APPROVAL_THRESHOLD = 10_000

GREETING = "Hello! I can help you submit expense reports."
ASK_TYPE = "What type of expense would you like to submit?"
ASK_APPROVAL = "This requires manager approval. Please provide PO number."
SUBMITTED = f"Expense submitted. Reference: {REFERENCE}"

_AMOUNT_RE = re.compile(r"\$\s?([\d,]+(?:\.\d+)?)")
_PO_RE = re.compile(r"PO-?\d+", re.IGNORECASE)
_YES_RE = re.compile(r"\b(?:yes|confirm|confirmed|proceed|ok|okay)\b", re.IGNORECASE)
_EXPENSE_WORDS = ("expense", "reimburs", "submit")
# Checked in order: "hotel dinner" is travel, as a trip's meals usually are.
_TYPE_KEYWORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("travel", ("travel", "flight", "hotel", "trip")),
    ("meals", ("dinner", "lunch", "meal")),
    ("equipment", ("equipment", "laptop")),
)

Amount = int | float


@dataclass(frozen=True)
class _Reply:
    content: str | None
    tool_calls: list[JSONObject] = field(default_factory=list)
    extra: JSONObject = field(default_factory=dict)


def respond(request_body: dict[str, Any]) -> dict[str, Any]:
    """Answer one Chat Completions request (see the module docstring for the rules)."""
    reply = _reply(messages_of(request_body))
    content = reply.content
    if content is not None and metadata_of(request_body).get("locale") == "fr":
        content = "[fr] " + content
    return completion(MODEL, request_body, content, tool_calls=reply.tool_calls, extra=reply.extra)


def _reply(messages: list[JSONObject]) -> _Reply:
    if messages and messages[-1].get("role") == "tool":
        return _after_tool_result(messages, messages[-1])
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    if last_user < 0:
        return _Reply(GREETING)
    return _after_user(messages[:last_user], messages[last_user])


def _after_user(earlier: list[JSONObject], message: JSONObject) -> _Reply:
    text = message_text(message)
    user_texts = [message_text(m) for m in earlier if m.get("role") == "user"] + [text]
    po = _PO_RE.search(text)
    if po:
        latest = _latest_amount(user_texts)
        if latest is None:
            return _Reply(f"Thanks, PO {po.group(0).upper()} recorded. {ASK_TYPE}")
        amount, source_text = latest
        return _create_expense(earlier, amount, source_text)
    if _YES_RE.search(text) and _confirmation_pending(earlier):
        return _submitted([*earlier, message])
    typed = _first_amount(text)
    if typed is not None:
        if typed >= APPROVAL_THRESHOLD and not any(_PO_RE.search(t) for t in user_texts):
            return _Reply(ASK_APPROVAL)
        return _create_expense(earlier, typed, text)
    # An image is a receipt even when the text also says "expense": ask for its amount.
    images = image_urls(message)
    if images:
        size = data_url_size(images[0])
        return _Reply(f"I received your receipt image ({size} bytes). What is the amount?")
    if any(word in text.lower() for word in _EXPENSE_WORDS):
        return _Reply(ASK_TYPE)
    return _Reply(GREETING)


def _after_tool_result(messages: list[JSONObject], result: JSONObject) -> _Reply:
    expense_id = _expense_id(message_text(result))
    args = _answered_call_args(messages, result.get("tool_call_id"))
    amount, expense_type = _draft(messages, args)
    return _Reply(
        f"I've prepared expense {expense_id} for ${amount} ({expense_type}). "
        "Shall I submit it? Please confirm."
    )


def _submitted(messages: list[JSONObject]) -> _Reply:
    amount, expense_type = _draft(messages, _latest_call_args(messages))
    expense = {
        "status": "submitted",
        "reference": REFERENCE,
        "amount": amount,
        "type": expense_type,
    }
    return _Reply(SUBMITTED, extra={"state": {"expense": expense}, "awaiting_input": False})


def _create_expense(earlier: list[JSONObject], amount: Amount, text: str) -> _Reply:
    # Ids only need to be unique within the conversation, so counting earlier calls
    # keeps them deterministic and lets `tool` messages refer back to them.
    previous_calls = sum(len(tool_calls_of(m)) for m in earlier if m.get("role") == "assistant")
    arguments = {"amount": amount, "type": detect_type(text), "description": text}
    call = tool_call(f"call_{previous_calls + 1}", TOOL_NAME, arguments)
    return _Reply(None, tool_calls=[call])


def detect_type(text: str) -> str:
    """The expense type named by `text` (see the module docstring)."""
    lowered = text.lower()
    for expense_type, keywords in _TYPE_KEYWORDS:
        if any(keyword in lowered for keyword in keywords):
            return expense_type
    return "other"


def _first_amount(text: str) -> Amount | None:
    for match in _AMOUNT_RE.finditer(text):
        digits = match.group(1).replace(",", "")
        # "$," matches the pattern but is no amount: try the next one.
        if digits:
            value = float(digits)
            return int(value) if value.is_integer() else value
    return None


def _latest_amount(user_texts: Sequence[str]) -> tuple[Amount, str] | None:
    """The most recent amount a user gave, with the text it came from."""
    for text in reversed(user_texts):
        amount = _first_amount(text)
        if amount is not None:
            return amount, text
    return None


def _confirmation_pending(earlier: Sequence[JSONObject]) -> bool:
    for message in earlier:
        if message.get("role") != "assistant":
            continue
        if "confirm" in message_text(message).lower():
            return True
        if any(_call_name(call) == TOOL_NAME for call in tool_calls_of(message)):
            return True
    return False


def _expense_id(result_text: str) -> str:
    try:
        result = json.loads(result_text)
    except ValueError:
        return DRAFT_ID
    if not isinstance(result, dict):
        return DRAFT_ID
    if str(result.get("status", "")).lower().startswith("not executed"):
        return DRAFT_ID
    expense_id = result.get("id")
    if isinstance(expense_id, str | int) and not isinstance(expense_id, bool) and expense_id != "":
        return str(expense_id)
    return DRAFT_ID


def _call_name(call: Mapping[str, Any]) -> str | None:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _call_args(call: Mapping[str, Any]) -> JSONObject:
    function = call.get("function")
    raw = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _expense_calls(messages: Sequence[JSONObject]) -> list[JSONObject]:
    return [
        call
        for m in messages
        if m.get("role") == "assistant"
        for call in tool_calls_of(m)
        if _call_name(call) == TOOL_NAME
    ]


def _latest_call_args(messages: Sequence[JSONObject]) -> JSONObject | None:
    calls = _expense_calls(messages)
    return _call_args(calls[-1]) if calls else None


def _answered_call_args(messages: Sequence[JSONObject], call_id: Any) -> JSONObject | None:
    for call in _expense_calls(messages):
        if call_id is not None and call.get("id") == call_id:
            return _call_args(call)
    return _latest_call_args(messages)


def _draft(messages: Sequence[JSONObject], args: JSONObject | None) -> tuple[Amount, str]:
    """Amount and type of the expense being drafted: tool call arguments first, then
    the latest amount a user typed, then (0, "other")."""
    if args is not None:
        amount = _as_amount(args.get("amount"))
        expense_type = args.get("type")
        if amount is not None:
            return amount, expense_type if isinstance(expense_type, str) else "other"
    user_texts = [message_text(m) for m in messages if m.get("role") == "user"]
    latest = _latest_amount(user_texts)
    if latest is None:
        return 0, "other"
    return latest[0], detect_type(latest[1])


def _as_amount(value: Any) -> Amount | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value) if float(value).is_integer() else value
    if isinstance(value, str):
        return _first_amount("$" + value.lstrip("$ "))
    return None
