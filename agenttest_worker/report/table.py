"""A fixed-width table for terminals: one line per case, the first problem shortened."""

from __future__ import annotations

from agenttest_worker.report.common import first_problem, format_ms, format_seconds
from agenttest_worker.report.model import RunReport
from agenttest_worker.results import CaseResult

HEADERS = ("ID", "STATUS", "TURNS", "DURATION", "REASON")
_ID_WIDTH_MAX = 24  # generated ids can be long; the reason column matters more
_REASON_WIDTH = 60


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(case: CaseResult) -> tuple[str, ...]:
    return (
        _cut(case.id, _ID_WIDTH_MAX),
        case.status.upper(),
        str(case.total_turns),
        format_ms(case.duration_ms),
        _cut(first_problem(case), _REASON_WIDTH),
    )


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    # Numbers are right-aligned so their digits line up; text is left-aligned.
    ident, status, turns, duration, reason = cells
    line = (
        f"{ident:<{widths[0]}}  {status:<{widths[1]}}  {turns:>{widths[2]}}  "
        f"{duration:>{widths[3]}}  {reason}"
    )
    return line.rstrip()


def render(run: RunReport) -> str:
    rows = [_row(case) for case in run.results]
    widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(4)]
    lines = [_line(HEADERS, widths), *(_line(r, widths) for r in rows)]
    s = run.summary()
    lines.append(
        f"{_plural(s.total)}: {s.passed} passed, {s.failed} failed, {s.skipped} skipped"
        f" in {format_seconds(s.duration_s)}"
    )
    return "\n".join(lines) + "\n"


def _plural(count: int) -> str:
    return f"{count} case" if count == 1 else f"{count} cases"
