"""The JSON documents that json_path and type assertions read (DESIGN.md), and JSON helpers."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agenttest_worker.results import ToolCall, TurnResult


def parse_json(text: str | None) -> tuple[bool, Any]:
    """(True, value) when `text` is a JSON object or array, else (False, None).

    Bare scalars are not treated as JSON: a reply "42" or "true" is text that happens
    to parse, and reading it as a number would surprise `contains` users.
    """
    if not text:
        return False, None
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return False, None
    try:
        return True, json.loads(stripped)
    except ValueError:
        return False, None


def turn_document(output: str | None, tool_calls: Iterable[ToolCall]) -> Any:
    """Per turn: the output parsed as JSON when it is JSON, else {content, tool_calls}."""
    is_json, value = parse_json(output)
    if is_json:
        return value
    return {
        "content": output if output is not None else "",
        "tool_calls": [call.model_dump(exclude_none=True) for call in tool_calls],
    }


def final_document(
    turns: list[TurnResult], tool_results: Mapping[str, Any], state: Any
) -> dict[str, Any]:
    """Final: {turns, last_output, tool_results, state}.

    When the agent reports a `state` object, its keys are also readable at the top
    level (never shadowing the four named keys), so the spec's `$.expense.status`
    works on an agent whose state is {"expense": {...}}.
    """
    ran = [t for t in turns if t.input is not None]
    last_output = ran[-1].output if ran else None
    is_json, parsed_last = parse_json(last_output)
    doc: dict[str, Any] = {}
    if isinstance(state, dict):
        doc.update(state)
    doc.update(
        {
            "turns": [turn_document(t.output, t.tool_calls) for t in ran],
            "last_output": parsed_last if is_json else last_output,
            "tool_results": dict(tool_results),
            "state": state,
        }
    )
    return doc


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: true is not 1, 1 equals 1.0, containers compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
