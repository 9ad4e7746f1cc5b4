"""Model "validator": a deterministic judge that checks the quoted phrases of the criteria.

Called as the spec's validator: `messages` end with the assistant response under
evaluation (for conversation-level judging, the whole conversation so far) and
`metadata` has test_mode "validator" and "criteria" (a string). Only the LAST
`assistant` message's text is judged ("" when there is none).

Rule: every phrase in double quotes ("..." or curly “...”) in the criteria is a check.
A phrase must appear in the judged text, case-insensitively, unless "not " or "never "
occurs in the 12 characters before its opening quote (and after the previous quoted
phrase, so `not "a" or "b"` forbids only "a"): then it must NOT appear.

    passed       every check is satisfied; true when there is no quoted phrase
    score        satisfied checks / checks (1.0 when there is none)
    reason       names the phrases found, missing, avoided and present though forbidden,
                 or "no quoted phrase to check in the criteria"
    suggestions  each missing required phrase as written in the criteria, then
                 'do not mention "<phrase>"' for each forbidden phrase present

The reply content wraps that JSON object in a markdown code fence after one line of
prose, on purpose, to exercise lenient parsing:

    Here is my evaluation:
    ```json
    {"passed": ..., "score": ..., "reason": ..., "suggestions": [...]}
    ```
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from agenttest_worker.demo._protocol import (
    JSONObject,
    completion,
    last_with_role,
    message_text,
    messages_of,
    metadata_of,
)

MODEL = "validator"
NO_PHRASE_REASON = "no quoted phrase to check in the criteria"
# How far before a quote a negation still applies: enough for `must not mention "x"`.
NEGATION_WINDOW = 12

_PHRASE_RE = re.compile(r"[\"“]([^\"“”]+)[\"”]")
_NEGATIONS = ("not ", "never ")


class Check(NamedTuple):
    phrase: str
    forbidden: bool
    present: bool

    @property
    def satisfied(self) -> bool:
        return self.present != self.forbidden


def respond(request_body: dict[str, Any]) -> dict[str, Any]:
    """Judge the last assistant message against the criteria (see the module docstring)."""
    criteria = metadata_of(request_body).get("criteria")
    last = last_with_role(messages_of(request_body), "assistant")
    verdict = evaluate(
        criteria if isinstance(criteria, str) else "",
        message_text(last) if last is not None else "",
    )
    content = "Here is my evaluation:\n```json\n" + json.dumps(verdict, indent=2) + "\n```"
    return completion(MODEL, request_body, content)


def checks(criteria: str, text: str) -> list[Check]:
    """One check per quoted phrase of `criteria`, against `text`."""
    lowered = text.lower()
    found: list[Check] = []
    previous_end = 0
    for match in _PHRASE_RE.finditer(criteria):
        window = criteria[max(previous_end, match.start() - NEGATION_WINDOW) : match.start()]
        forbidden = any(negation in window.lower() for negation in _NEGATIONS)
        phrase = match.group(1)
        found.append(Check(phrase, forbidden, phrase.lower() in lowered))
        previous_end = match.end()
    return found


def evaluate(criteria: str, text: str) -> JSONObject:
    """The verdict {passed, score, reason, suggestions} for `text` under `criteria`."""
    results = checks(criteria, text)
    if not results:
        return {"passed": True, "score": 1.0, "reason": NO_PHRASE_REASON, "suggestions": []}
    satisfied = sum(check.satisfied for check in results)
    suggestions = [c.phrase for c in results if not c.forbidden and not c.present] + [
        f'do not mention "{c.phrase}"' for c in results if c.forbidden and c.present
    ]
    return {
        "passed": satisfied == len(results),
        "score": satisfied / len(results),
        "reason": _reason(results),
        "suggestions": suggestions,
    }


def _reason(results: list[Check]) -> str:
    groups = (
        ("found", [c for c in results if not c.forbidden and c.present]),
        ("missing", [c for c in results if not c.forbidden and not c.present]),
        ("avoided", [c for c in results if c.forbidden and not c.present]),
        ("present though forbidden", [c for c in results if c.forbidden and c.present]),
    )
    parts = [
        label + " " + ", ".join(f'"{c.phrase}"' for c in group) for label, group in groups if group
    ]
    return "; ".join(parts)
