"""A fixed-width table for terminals: one line per case, the first problem shortened.

When some case was played more than once, a case is one line with its verdict and a
REPEATS column ("3/5", "3/5 flaky"); TURNS and DURATION add up its repetitions, and the
reason is the first failed repetition's. A run of several targets (`-n A -n B`) has a
TARGET column after ID: a line per case and target, a case's lines together.
"""

from __future__ import annotations

from agenttest_worker.report.common import (
    counted,
    first_problem,
    format_ms,
    format_seconds,
    printable,
)
from agenttest_worker.report.report_model import RunReport
from agenttest_worker.report.target_columns import target_rows
from agenttest_worker.report.verdicts import CaseVerdict, grouped
from agenttest_worker.results import CaseResult

HEADERS = ("ID", "STATUS", "TURNS", "DURATION", "REASON")
REPEAT_HEADERS = ("ID", "STATUS", "REPEATS", "TURNS", "DURATION", "REASON")
_ID_WIDTH_MAX = 24  # generated ids can be long; the reason column matters more
_REASON_WIDTH = 60


def _cut(text: str, width: int) -> str:
    # A table is read on a terminal: ids and reasons are data, their controls escaped.
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(case: CaseResult) -> tuple[str, ...]:
    return (
        _cut(case.id, _ID_WIDTH_MAX),
        case.status.upper(),
        str(case.total_turns),
        format_ms(case.duration_ms),
        _cut(first_problem(case), _REASON_WIDTH),
    )


def _repeated_row(records: list[CaseResult], found: CaseVerdict) -> tuple[str, ...]:
    failing = next((r for r in records if r.status != "passed"), None)
    return (
        _cut(found.id, _ID_WIDTH_MAX),
        found.status.upper(),
        found.fraction() + (" flaky" if found.flaky else ""),
        str(sum(r.total_turns for r in records)),
        format_ms(sum(r.duration_ms for r in records)),
        _cut(first_problem(failing) if failing else "", _REASON_WIDTH),
    )


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    # Numbers are right-aligned so their digits line up; text is left-aligned.
    *left, turns, duration, reason = cells
    line = "".join(f"{cell:<{widths[i]}}  " for i, cell in enumerate(left))
    line += f"{turns:>{widths[len(left)]}}  {duration:>{widths[len(left) + 1]}}  {reason}"
    return line.rstrip()


def render(run: RunReport) -> str:
    # One pass, holding rows, not records: whether the table needs its REPEATS column is
    # known at the end, so each case keeps both of its rows until then.
    tally = run.tally()
    both: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for records in grouped(run.results):
        found = tally.add_case(records)
        both.append((_row(records[0]), _repeated_row(records, found)))
    headers: tuple[str, ...] = HEADERS
    rows = [plain for plain, _ in both]
    if tally.verdicts.repeated:
        headers, rows = REPEAT_HEADERS, [repeated for _, repeated in both]
    if target_rows(tally.verdicts.cases) is not None:
        # Several targets: a line per case and target, a case's lines together.
        headers = (headers[0], "TARGET", *headers[1:])
        rows = [
            (row[0], _cut(found.agent or "-", _ID_WIDTH_MAX), *row[1:])
            for row, found in zip(rows, tally.verdicts.cases, strict=True)
        ]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers) - 1)]
    lines = [_line(headers, widths), *(_line(r, widths) for r in rows)]
    s = tally.summary(run.duration_s, run.budget)
    lines.append(
        f"{_plural(s.total)}: {s.passed} passed, {s.failed} failed, {s.skipped} skipped"
        f" in {format_seconds(s.duration_s)}"
    )
    if s.repeats is not None:
        lines += s.repeats.lines()
        if s.repeats.flaky:
            lines.append(f"Flaky: {', '.join(printable(i) for i in s.repeats.flaky)}")
    return "\n".join(lines) + "\n"


def _plural(count: int) -> str:
    return counted(count, "case")
