"""Model "user-sim": a user simulator that answers the expense assistant's questions.

Called as the spec's simulator: a system prompt, the conversation (a transcript, or the
messages), and `metadata` with test_mode "simulator", persona, goal, turn_number,
max_turns, last_response. Only the agent's last response matters: metadata's
`last_response`, else the last `assistant` message's text (none, or a tool call without
text, reads as ""); persona, goal and turn counts are ignored.

The reply content is the JSON object {"input": str, "goal_achieved": bool,
"reasoning": str}. Rules on the last assistant text, case-insensitive, first match wins:

    contains "submitted"        -> input "", goal_achieved true
    contains "type of expense"  -> "It's for a client dinner, $250"
    contains "po number"        -> "PO-12345"
    contains "confirm"          -> "Yes, confirm"
    contains "amount"           -> "The amount is $500"
    anything else               -> "Please continue"

goal_achieved is false except for "submitted"; reasoning is a fixed sentence per rule.

With `"junk": true` in metadata (a boolean or the string "true"), the reply is the
non-JSON text "I am not sure what to say", for tests of a simulator that returns junk.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from agenttest_worker.demo._protocol import (
    completion,
    is_true,
    last_with_role,
    message_text,
    messages_of,
    metadata_of,
)

MODEL = "user-sim"
JUNK = "I am not sure what to say"


class _Rule(NamedTuple):
    trigger: str
    input: str
    goal_achieved: bool
    reasoning: str


# Order matters: "Shall I submit it? Please confirm." must be confirmed, and a reply
# saying "submitted" ends the conversation whatever else it says.
_RULES: tuple[_Rule, ...] = (
    _Rule("submitted", "", True, "The agent reports the expense as submitted."),
    _Rule(
        "type of expense",
        "It's for a client dinner, $250",
        False,
        "The agent asked for the type of expense.",
    ),
    _Rule("po number", "PO-12345", False, "The agent asked for a PO number."),
    _Rule("confirm", "Yes, confirm", False, "The agent asked for confirmation."),
    _Rule("amount", "The amount is $500", False, "The agent asked for the amount."),
)
_FALLBACK = _Rule("", "Please continue", False, "The agent asked nothing specific.")


def respond(request_body: dict[str, Any]) -> dict[str, Any]:
    """Answer one simulator call (see the module docstring for the rules)."""
    metadata = metadata_of(request_body)
    if is_true(metadata.get("junk")):
        return completion(MODEL, request_body, JUNK)
    last_response = metadata.get("last_response")
    if not isinstance(last_response, str):
        last = last_with_role(messages_of(request_body), "assistant")
        last_response = message_text(last) if last is not None else ""
    rule = _choose_rule(last_response)
    content = json.dumps(
        {"input": rule.input, "goal_achieved": rule.goal_achieved, "reasoning": rule.reasoning}
    )
    return completion(MODEL, request_body, content)


def _choose_rule(assistant_text: str) -> _Rule:
    """The first rule whose trigger appears in the assistant's text."""
    lowered = assistant_text.lower()
    return next((rule for rule in _RULES if rule.trigger in lowered), _FALLBACK)
