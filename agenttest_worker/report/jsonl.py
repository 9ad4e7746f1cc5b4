"""JSONL: one CaseResult record per line, exactly what `-o` writes and readers parse back."""

from __future__ import annotations

from collections.abc import Iterator

from agenttest_worker.report.report_model import RunReport, StoredResults
from agenttest_worker.report.verdicts import settled_lines


def render(run: RunReport) -> str:
    return "".join(render_chunks(run))


def render_chunks(run: RunReport) -> Iterator[str]:
    """The records, a line each (a caller streaming them gathers its own writes)."""
    # The record is the result model itself, so the JSONL never drifts from the schema.
    if isinstance(run.results, StoredResults):
        lines = run.results.json_lines()
    else:
        lines = (case.to_json_line() for case in run.results)
    # Cases of --repeat auto say how many repetitions they took (report/verdicts.py).
    for line in settled_lines(lines, run.pass_rule):
        yield f"{line}\n"
