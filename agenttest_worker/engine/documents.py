"""The JSON documents that json_path and type assertions read (DESIGN.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agenttest_worker.json_values import parse_json
from agenttest_worker.results import ToolCall, TurnResult


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

    `state` is the end state read from the agent's system when the case or its agent
    declares one (engine/end_state.py), else the state the agent reported. When it is
    an object, its keys are also readable at the top level (never shadowing the four
    named keys), so the spec's `$.expense.status` works on a state {"expense": {...}}.
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
