"""`scripts:tests.validate-expense`: a script assertion on the expense the agent drafted.

Called per turn as validate(response, metadata): `response` holds the turn's input,
output, tool_calls, document, messages, final and case_id; `metadata` is the
assertion's `options.metadata`. Returning {"passed", "reason"} puts the reason in the
report either way.
"""

from __future__ import annotations

from typing import Any

KNOWN_TYPES = ("travel", "meals", "equipment", "other")


def validate(response: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    calls = [c for c in response["tool_calls"] if c.get("name") == "create_expense"]
    if not calls:
        return {"passed": False, "reason": "create_expense was not called"}
    args = calls[-1].get("args") or {}
    amount, kind = args.get("amount"), args.get("type")
    low = metadata.get("min_amount", 0)
    high = metadata.get("max_amount", float("inf"))
    # bool is an int: a model answering `"amount": true` must not pass as 1.
    if not isinstance(amount, int | float) or isinstance(amount, bool):
        return {"passed": False, "reason": f"amount {amount!r} is not a number"}
    if not low <= amount <= high:
        return {"passed": False, "reason": f"amount {amount} is outside {low}..{high}"}
    if kind not in KNOWN_TYPES:
        return {"passed": False, "reason": f"unknown expense type {kind!r}"}
    return {"passed": True, "reason": f"{kind} expense of {amount} within {low}..{high}"}
