"""TSV: a header and one row per case, for spreadsheets and `cut`/`awk`.

Tabs, newlines and backslashes inside values are written as \\t, \\n, \\r and \\\\
(the "linear TSV" convention), so every case stays exactly one row.

When some case was played more than once, a case is still one row, with its verdict
as `status`, turns, duration and assertion counts added up over its repetitions, its
failed repetitions' problems, and three more columns at the end: `repeats` (K),
`passed_repeats` and `flaky` (true/false).
"""

from __future__ import annotations

from agenttest_worker.report.common import assertion_counts, problems
from agenttest_worker.report.model import RunReport
from agenttest_worker.report.verdicts import case_verdict, grouped
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
REPEAT_COLUMNS = (*COLUMNS, "repeats", "passed_repeats", "flaky")
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


def _repeated_row(records: list[CaseResult], rule: str) -> list[object]:
    found = case_verdict(records, rule)
    counts = [assertion_counts(r) for r in records]
    reason = "; ".join(
        f"repetition {r.repeat}/{r.repeats}: {'; '.join(problems(r))}"
        for r in records
        if r.status != "passed" and problems(r)
    )
    return [
        found.id,
        found.name,
        found.status,
        sum(r.total_turns for r in records),
        sum(r.duration_ms for r in records),
        sum(p for p, _ in counts),
        sum(f for _, f in counts),
        reason,
        found.played,
        found.passed,
        "true" if found.flaky else "false",
    ]


def render(run: RunReport) -> str:
    groups = list(grouped(run.results))
    rows: list[list[object]]
    if any(records[0].repeats is not None for records in groups):
        rows = [list(REPEAT_COLUMNS), *(_repeated_row(g, run.pass_rule) for g in groups)]
    else:
        rows = [list(COLUMNS), *(_row(records[0]) for records in groups)]
    return "".join("\t".join(escape(v) for v in row) + "\n" for row in rows)
