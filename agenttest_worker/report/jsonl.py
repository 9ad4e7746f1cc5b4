"""JSONL: one CaseResult record per line, exactly what `-o` writes and readers parse back."""

from __future__ import annotations

from collections.abc import Iterator

from agenttest_worker.report.model import RunReport

# Records per piece of render_chunks: enough that writing a piece costs little next to
# building it, few enough that a piece stays small (~1 KB per record of 3 turns).
_RECORDS_PER_CHUNK = 200


def render(run: RunReport) -> str:
    return "".join(render_chunks(run))


def render_chunks(run: RunReport) -> Iterator[str]:
    """The records, a few hundred lines at a time."""
    # The record is the result model itself, so the JSONL never drifts from the schema.
    lines: list[str] = []
    for case in run.results:
        lines.append(f"{case.to_json_line()}\n")
        if len(lines) == _RECORDS_PER_CHUNK:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)
