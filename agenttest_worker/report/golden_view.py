"""A failed golden assertion's diff, golden | new turn by turn, as the reports show it.

Built from the case's record alone: the golden conversation travels in the assertion's
result (`recorded`, as the submitter read it), the new one is the record's turns.
Every text is data: escaped for a terminal here, a DOM text node in the HTML page.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from agenttest_worker.assertions.golden_conversations import (
    GoldenConversation,
    GoldenTurn,
    TurnDiff,
    compare,
    describe_calls,
    played_turns,
)
from agenttest_worker.report.common import one_line, quoted
from agenttest_worker.results import AssertionResult, CaseResult


def golden_rows(assertion: AssertionResult, case: CaseResult) -> list[TurnDiff] | None:
    """The turn-by-turn comparison a failed golden assertion made; None for any other
    assertion, a passed one, or one without a golden conversation to compare."""
    extras = assertion.model_extra or {}
    recorded = extras.get("recorded")
    if assertion.type != "golden" or assertion.passed or not isinstance(recorded, dict):
        return None
    try:
        golden = GoldenConversation.model_validate(recorded)
    except ValidationError:
        return None
    return compare(golden.turns, played_turns(case.turns), args=extras.get("args") != "ignore")


def differences(row: TurnDiff) -> str:
    """What differs in a turn: "reply", "tool calls", both, or "only in golden"/"new"."""
    if row.golden is None:
        return "only in new"
    if row.new is None:
        return "only in golden"
    parts = (["reply"] if row.reply_differs else []) + (["tool calls"] if row.tools_differ else [])
    return ", ".join(parts) or "the same"


def _turn_text(turn: GoldenTurn | None) -> str:
    if turn is None:
        return "(no such turn)"
    parts = [quoted(turn.reply)] if turn.reply else []
    if turn.tool_calls:
        parts.append(f"[tools: {one_line(describe_calls(turn.tool_calls), 200)}]")
    return " ".join(parts) or "(empty reply)"


def console_lines(rows: list[TurnDiff]) -> list[str]:
    """The diff under the assertion in the console report: each turn the same (=) or
    what differs (≠), then the golden and the new reply and tool calls."""
    lines = ["Golden | new, turn by turn:"]
    for row in rows:
        if not row.differs:
            lines.append(f"  Turn {row.turn} = the same")
            continue
        lines.append(f"  Turn {row.turn} ≠ {differences(row)}")
        lines.append(f"    golden: {_turn_text(row.golden)}")
        lines.append(f"    new:    {_turn_text(row.new)}")
    return lines


def _page_turn(turn: GoldenTurn | None) -> dict[str, Any] | None:
    if turn is None:
        return None
    return {"reply": turn.reply, "tools": describe_calls(turn.tool_calls)}


def page_rows(rows: list[TurnDiff]) -> list[dict[str, Any]]:
    """The diff as the HTML page renders it (conversation.js `goldenDiff`)."""
    return [
        {
            "turn": row.turn,
            "differs": differences(row) if row.differs else "",
            "golden": _page_turn(row.golden),
            "new": _page_turn(row.new),
        }
        for row in rows
    ]
