"""Agents' spans in the store (models.AgentSpanRow): kept by the OTLP receiver's intake
for the runs in progress, read by trace assertions on any worker and by the reports.

A trace keeps at most `MAX_SPANS_PER_TRACE` spans: an agent that sends more has the rest
refused, never the store filled."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select

from agenttest_worker.observe.received_spans import AgentSpan
from agenttest_worker.store.sql.db import session_scope, upgrade
from agenttest_worker.store.sql.models import AgentSpanRow, RunRow
from agenttest_worker.store.sql.shared import insert_ignoring
from agenttest_worker.store.storable import storable_row

MAX_SPANS_PER_TRACE = 2000


def runs_in_progress(url: str) -> list[str]:
    """The ids of the runs that have not ended."""
    upgrade(url)  # (a no-op once done: an embedded run's store may be making it now)
    with session_scope(url) as session:
        return list(session.scalars(select(RunRow.id).where(RunRow.status != "done")))


def keep_spans(url: str, run_id: str, trace_id: str, spans: Sequence[AgentSpan]) -> int:
    """Store `spans` (all of `trace_id`) for `run_id`, within the trace's bound; how
    many were kept (a span sent again is kept once)."""
    upgrade(url)
    with session_scope(url) as session:
        held = session.scalar(
            select(func.count())
            .select_from(AgentSpanRow)
            .where(AgentSpanRow.run_id == run_id, AgentSpanRow.trace_id == trace_id)
        )
        room = max(MAX_SPANS_PER_TRACE - int(held or 0), 0)
        chosen = list(spans[:room])
        insert_ignoring(
            session, AgentSpanRow, [storable_row(_row(run_id, span)) for span in chosen]
        )
    return len(chosen)


def _row(run_id: str, span: AgentSpan) -> dict[str, object]:
    return {
        "run_id": run_id,
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "start_ns": span.start_ns,
        "end_ns": span.end_ns,
        "error": span.error,
        "status_message": span.status_message,
        "turn": span.turn,
        "service": span.service,
        "attributes": span.attributes,
    }


def _span(row: AgentSpanRow) -> AgentSpan:
    return AgentSpan(
        trace_id=row.trace_id,
        span_id=row.span_id,
        parent_span_id=row.parent_span_id,
        name=row.name,
        start_ns=row.start_ns,
        end_ns=row.end_ns,
        error=row.error,
        status_message=row.status_message,
        turn=row.turn,
        service=row.service,
        attributes=row.attributes or {},
    )


class StoredSpans:
    """The spans of a trace as the store has them (a SpanReader)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def spans_of(self, trace_id: str) -> list[AgentSpan]:
        upgrade(self.url)
        with session_scope(self.url) as session:
            rows = session.scalars(
                select(AgentSpanRow)
                .where(AgentSpanRow.trace_id == trace_id)
                .order_by(AgentSpanRow.start_ns)
            )
            return [_span(row) for row in rows]


def spans_of_run(url: str, run_id: str) -> dict[str, list[AgentSpan]]:
    """Every span kept for `run_id`, by trace id."""
    found: dict[str, list[AgentSpan]] = {}
    with session_scope(url) as session:
        rows = session.scalars(
            select(AgentSpanRow)
            .where(AgentSpanRow.run_id == run_id)
            .order_by(AgentSpanRow.trace_id, AgentSpanRow.start_ns)
        )
        for row in rows:
            found.setdefault(row.trace_id, []).append(_span(row))
    return found
