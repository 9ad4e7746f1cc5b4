"""TSV: a header and one row per case, for spreadsheets and `cut`/`awk`.

Tabs, newlines and backslashes inside values are written as \\t, \\n, \\r and \\\\
(the "linear TSV" convention), so every case stays exactly one row.

When some case was played more than once, a case is still one row, with its verdict
as `status`, turns, duration and assertion counts added up over its repetitions, its
failed repetitions' problems, and three more columns at the end: `repeats` (K),
`passed_repeats` and `flaky` (true/false). A run of several targets (`-n A -n B`) has
a row per case and target, a case's rows together, and a `target` column last.
"""

from __future__ import annotations

from agenttest_worker.report.common import assertion_counts, problems
from agenttest_worker.report.report_model import RunReport
from agenttest_worker.report.target_columns import target_rows
from agenttest_worker.report.verdicts import CaseVerdict, grouped
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


def _repeated_row(records: list[CaseResult], found: CaseVerdict) -> list[object]:
    counts = [assertion_counts(r) for r in records]
    said = [(r, list(problems(r))) for r in records if r.status != "passed"]
    reason = "; ".join(
        f"repetition {r.repeat}/{found.played}: {'; '.join(found_problems)}"
        for r, found_problems in said
        if found_problems
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
    # One pass, holding rows, not records: whether the repeat columns are wanted is
    # known at the end, so each case keeps both of its rows until then.
    tally = run.tally()
    both = [
        (_row(records[0]), _repeated_row(records, tally.add_case(records)))
        for records in grouped(run.results)
    ]
    rows: list[list[object]] = [list(COLUMNS), *(plain for plain, _ in both)]
    if tally.verdicts.repeated:
        rows = [list(REPEAT_COLUMNS), *(repeated for _, repeated in both)]
    if target_rows(tally.verdicts.cases) is not None:
        # Several targets: a row per case and target, the target last.
        rows = [
            [*rows[0], "target"],
            *(
                [*row, found.agent]
                for row, found in zip(rows[1:], tally.verdicts.cases, strict=True)
            ),
        ]
    return "".join("\t".join(escape(v) for v in row) + "\n" for row in rows)
