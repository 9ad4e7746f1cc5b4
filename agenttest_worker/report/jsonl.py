"""JSONL: one CaseResult record per line, exactly what `-o` writes and readers parse back."""

from __future__ import annotations

from agenttest_worker.report.model import RunReport


def render(run: RunReport) -> str:
    # The record is the result model itself, so the JSONL never drifts from the schema.
    return "".join(f"{case.to_json_line()}\n" for case in run.results)
