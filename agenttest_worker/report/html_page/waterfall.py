"""What the conversation pages show of a conversation's trace: the link to it in the
trace UI AGENTTEST_TRACE_URL names, and each turn's received spans as a waterfall.

A span is drawn in the turn its tracestate names, or that of its nearest ancestor that
names one (observe/received_spans.py); one whose turn cannot be told is not drawn. Each
bar is placed from the turn's first span, at the depth of its ancestry among the turn's
spans. Everything in a span is the agent's (untrusted): the page shows it as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agenttest_worker.observe.received_spans import AgentSpan
from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings

# Bars drawn per turn; a turn with more says how many were left out.
MAX_BARS = 200
_SCHEMES = ("https://", "http://")


def trace_link(trace_id: str | None) -> str | None:
    """The trace's address in the configured trace UI, or None (no UI, no trace, or a
    template that is not an http(s) address)."""
    template = get_settings().trace_url
    if not template or not trace_id or not template.lower().startswith(_SCHEMES):
        return None
    return template.replace("{trace_id}", trace_id)


def trace_notes(case: CaseResult, spans: Sequence[AgentSpan] | None) -> dict[str, Any]:
    """`trace_url` and, by turn index, `spans` (the waterfall's bars) for `case`."""
    notes: dict[str, Any] = {}
    if (url := trace_link(case.trace_id)) is not None:
        notes["trace_url"] = url
    if spans:
        bars = [_bars(spans, turn.turn) for turn in case.turns]
        if any(bars):
            notes["spans"] = bars
    return notes


def _turn_of(span: AgentSpan, by_id: dict[str, AgentSpan]) -> int | None:
    seen: set[str] = set()
    current: AgentSpan | None = span
    while current is not None and current.span_id not in seen:
        if current.turn is not None:
            return current.turn
        seen.add(current.span_id)
        current = by_id.get(current.parent_span_id or "")
    return None


def _bars(spans: Sequence[AgentSpan], turn: int) -> list[dict[str, Any]]:
    by_id = {span.span_id: span for span in spans}
    mine = sorted((s for s in spans if _turn_of(s, by_id) == turn), key=lambda s: s.start_ns)
    if not mine:
        return []
    origin = mine[0].start_ns
    ids = {span.span_id for span in mine}
    bars = []
    for span in mine[:MAX_BARS]:
        depth, parent = 0, span.parent_span_id
        while parent in ids and depth < 32:
            depth += 1
            parent = by_id[parent].parent_span_id if parent else None
        bars.append(
            {
                "name": span.name,
                "service": span.service,
                "start_ms": round((span.start_ns - origin) / 1e6, 3),
                "duration_ms": round(span.duration_ms, 3),
                "error": span.error,
                "depth": depth,
            }
        )
    if len(mine) > MAX_BARS:
        bars.append({"more": len(mine) - MAX_BARS})
    return bars
