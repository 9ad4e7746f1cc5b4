"""JSONL: one CaseResult record per line, exactly what `-o` writes and readers parse back."""

from __future__ import annotations

from collections.abc import Iterator

from agenttest_worker.report.model import RunReport


def render(run: RunReport) -> str:
    return "".join(render_chunks(run))


def render_chunks(run: RunReport) -> Iterator[str]:
    """The records, a line each (a caller streaming them gathers its own writes)."""
    # The record is the result model itself, so the JSONL never drifts from the schema.
    for case in run.results:
        yield f"{case.to_json_line()}\n"
