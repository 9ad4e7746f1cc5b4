"""TSV: a header and one row per case, for spreadsheets and `cut`/`awk`.

Tabs, newlines and backslashes inside values are written as \\t, \\n, \\r and \\\\
(the "linear TSV" convention), so every case stays exactly one row.
"""

from __future__ import annotations

from agenttest_worker.report.common import assertion_counts, problems
from agenttest_worker.report.model import RunReport
from agenttest_worker.results import CaseResult

COLUMNS = (
    "id",
    "name",
    "status",
    "turns",
    "duration_ms",
    "passed_assertions",
    "failed_assertions",
    "error_or_reason",
)
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def escape(value: object) -> str:
    return "" if value is None else str(value).translate(_ESCAPES)


def _row(case: CaseResult) -> list[object]:
    passed, failed = assertion_counts(case)
    # Every problem, not just the first: a spreadsheet cell is the place to read them all.
    reason = "; ".join(problems(case))
    return [
        case.id,
        case.name,
        case.status,
        case.total_turns,
        case.duration_ms,
        passed,
        failed,
        reason,
    ]


def render(run: RunReport) -> str:
    rows: list[list[object]] = [list(COLUMNS), *(_row(case) for case in run.results)]
    return "".join("\t".join(escape(v) for v in row) + "\n" for row in rows)
