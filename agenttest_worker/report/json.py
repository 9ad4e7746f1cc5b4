"""JSON: one document with the run's identity, its summary and every case record.

When some case was played more than once, `results` holds every repetition's record and
`cases` each case's verdict (`{id, name, status, passed, repeats, flaky}`), and the
summary's `repeats` the run's statistics (report/verdicts.py). A run of several
targets (`-n A -n B`) has `targets` (their names) and `cases` each case once, with its
verdict on each target: `{id, name, targets: {A: {status, passed, repeats, flaky}}}`.
`usage_by_role` (when an agent was called) is the run's calls, tokens and cost by
role, its generators' included.
"""

from __future__ import annotations

import json
from typing import Any

from agenttest_worker.report.report_model import RunReport
from agenttest_worker.report.target_columns import target_rows, targets_of
from agenttest_worker.report.usage_tally import usage_dict


def document(run: RunReport) -> dict[str, Any]:
    tally = run.tally()
    results = []
    for case in run.results:
        tally.add(case)
        # mode="json" turns every value into plain JSON (the records are JSONL-identical).
        results.append(case.model_dump(mode="json"))
    summary = run.counted = tally.summary(run.duration_s, run.budget)
    found: dict[str, Any] = {
        "run_id": run.run_id,
        "agent": run.agent,
        "summary": summary.as_dict(),
        "results": results,
    }
    if summary.usage:
        found["usage_by_role"] = usage_dict(summary.usage)
    if summary.repeats is not None:
        found["cases"] = [case.as_dict() for case in tally.verdicts.cases]
    rows = target_rows(tally.verdicts.cases)
    if rows is not None:
        # Several targets: each case once, its verdict on each (report/target_columns.py).
        found["targets"] = targets_of(rows)
        found["cases"] = [row.as_dict() for row in rows]
    return found


def render(run: RunReport) -> str:
    return json.dumps(document(run), indent=2, ensure_ascii=False) + "\n"
