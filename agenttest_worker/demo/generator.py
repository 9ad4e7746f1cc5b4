"""Model "generator": a test case generator for the "expense" demo agent.

Called as the spec's generator, with `metadata` test_mode "generator", target_agent,
count, focus and the other query parameters (target_description, target_tools,
complexity, ... are accepted and ignored). The reply content is the JSON object
{"cases": [...]} with exactly `count` cases in the JSONL case format.

    count            an int or a numeric string; default 3 when absent or not a number,
                     0 when negative
    focus            default "happy-path"; it only appears in the case names
    include_invalid  true (boolean or "true"): the second case is invalid on purpose,
                     its first assertion has type "contanis" (a typo of "contains")

Case i (ids "G001", "G002", ...) follows scenario i modulo 3, each of which passes
against the "expense" demo agent:

    1. "Greeting" (single turn): input "Hello", assertion contains "expense reports".
    2. "Travel expense draft" (multi_turn): "I want to submit an expense report" with
       contains "type of expense", then "Business travel to Beijing, flight $3500" with
       tool_called "create_expense".
    3. "Large expense approval" (multi_turn): "Submit $100,000 equipment purchase" with
       contains "manager approval", then "PO-12345" with tool_called "create_expense".

Case names are "<scenario> (<focus>)".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agenttest_worker.demo._protocol import JSONObject, completion, is_true, metadata_of

MODEL = "generator"
DEFAULT_COUNT = 3
DEFAULT_FOCUS = "happy-path"
INVALID_ASSERTION_TYPE = "contanis"


def _contains(value: str) -> JSONObject:
    return {"type": "contains", "value": value}


def _tool_called(name: str) -> JSONObject:
    return {"type": "tool_called", "name": name}


def _greeting() -> JSONObject:
    # A single turn that does not await input, so it passes without more turns.
    return {
        "name": "Greeting",
        "input": "Hello",
        "assertions": [_contains("expense reports")],
    }


def _travel_draft() -> JSONObject:
    return {
        "name": "Travel expense draft",
        "type": "multi_turn",
        "turns": [
            {
                "input": "I want to submit an expense report",
                "assertions": [_contains("type of expense")],
            },
            {
                "input": "Business travel to Beijing, flight $3500",
                "assertions": [_tool_called("create_expense")],
            },
        ],
    }


def _large_approval() -> JSONObject:
    return {
        "name": "Large expense approval",
        "type": "multi_turn",
        "turns": [
            {
                "input": "Submit $100,000 equipment purchase",
                "assertions": [_contains("manager approval")],
            },
            {"input": "PO-12345", "assertions": [_tool_called("create_expense")]},
        ],
    }


# Builders rather than shared dicts: every case is a fresh object that can be altered.
_SCENARIOS: tuple[Callable[[], JSONObject], ...] = (_greeting, _travel_draft, _large_approval)


def respond(request_body: dict[str, Any]) -> dict[str, Any]:
    """Generate the cases the metadata asks for (see the module docstring)."""
    metadata = metadata_of(request_body)
    cases = generate(
        parse_count(metadata.get("count")),
        _focus(metadata.get("focus")),
        include_invalid=is_true(metadata.get("include_invalid")),
    )
    return completion(MODEL, request_body, json.dumps({"cases": cases}))


def generate(count: int, focus: str, *, include_invalid: bool = False) -> list[JSONObject]:
    """`count` cases cycling through the scenarios."""
    cases = [_case(index, focus) for index in range(count)]
    if include_invalid and len(cases) > 1:
        _first_assertion(cases[1])["type"] = INVALID_ASSERTION_TYPE
    return cases


def parse_count(value: Any) -> int:
    """`count` as sent: an int, or a string when it came from a query string."""
    if isinstance(value, bool):  # bool is an int subclass, but True is no count
        return DEFAULT_COUNT
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str):
        try:
            return max(int(value.strip()), 0)
        except ValueError:
            return DEFAULT_COUNT
    return DEFAULT_COUNT


def _focus(value: Any) -> str:
    return value if isinstance(value, str) and value.strip() else DEFAULT_FOCUS


def _case(index: int, focus: str) -> JSONObject:
    case = _SCENARIOS[index % len(_SCENARIOS)]()
    case["name"] = f"{case['name']} ({focus})"
    return {"id": f"G{index + 1:03d}", **case}


def _first_assertion(case: JSONObject) -> JSONObject:
    assertions = case["turns"][0]["assertions"] if "turns" in case else case["assertions"]
    first: JSONObject = assertions[0]
    return first
