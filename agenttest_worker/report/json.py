"""JSON: one document with the run's identity, its summary and every case record."""

from __future__ import annotations

import json
from typing import Any

from agenttest_worker.report.model import RunReport


def document(run: RunReport) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "agent": run.agent,
        "summary": run.summary().as_dict(),
        # mode="json" turns every value into plain JSON (the records are JSONL-identical).
        "results": [case.model_dump(mode="json") for case in run.results],
    }


def render(run: RunReport) -> str:
    return json.dumps(document(run), indent=2, ensure_ascii=False) + "\n"
