"""Markdown: a run's summary and the cases that did not pass, for a CI step summary or
a pull-request comment. Case ids, names and problems are data: escaped as in the diff's
Markdown (`diff_formats.md`), so no HTML, link or formatting gets through."""

from __future__ import annotations

from collections.abc import Iterator

from agenttest_worker.report.causes import causes_line
from agenttest_worker.report.common import first_problem, format_seconds
from agenttest_worker.report.diff_formats import md
from agenttest_worker.report.report_model import RunReport
from agenttest_worker.report.target_columns import target_rows
from agenttest_worker.report.verdicts import grouped
from agenttest_worker.results import CaseResult

# Cases listed (failed first, then skipped); a CI page is read, not searched: the
# rest are counted, and the HTML report or `report RUN` has them all.
LISTED = 50
_MARKS = {"failed": "✗", "skipped": "○"}


def render(run: RunReport) -> str:
    return "".join(render_chunks(run))


def render_chunks(run: RunReport) -> Iterator[str]:
    tally = run.tally()
    shown: dict[str, list[tuple[CaseResult, str]]] = {"failed": [], "skipped": []}
    for records in grouped(run.results):
        found = tally.add_case(records)
        if found.status in shown:
            # A repeated case: the first repetition that did not pass says why.
            first = next((r for r in records if r.status != "passed"), records[0])
            shown[found.status].append((first, found.fraction() if found.repeated else ""))
    summary = tally.summary(run.duration_s, run.budget)
    # A run of several targets: each listed case says on which it did not pass.
    several = target_rows(tally.verdicts.cases) is not None
    verdict = "failed" if summary.run_failed else "passed"
    lines = [
        f"### agenttest — {verdict}",
        "",
        "| Total | Passed | Failed | Skipped | Turns | Duration |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {summary.total} | {summary.passed} | {summary.failed} | {summary.skipped} "
        f"| {summary.total_turns} | {format_seconds(summary.duration_s)} |",
    ]
    if caused := causes_line(summary.causes):
        # Failed or skipped conversations by cause (report/causes.py).
        lines += ["", f"Causes: {md(caused)}"]
    if run.run_id:
        lines += ["", f"Run `{run.run_id}`."]
    if summary.stopped:
        lines += ["", f"The run stopped before every case was tested: {md(summary.stopped)}."]
    for status, title_word in (("failed", "Failed"), ("skipped", "Skipped")):
        cases = shown[status]
        if not cases:
            continue
        lines += ["", f"#### {title_word} ({len(cases)})", ""]
        lines += [_case_line(status, case, fraction, several) for case, fraction in cases[:LISTED]]
        if len(cases) > LISTED:
            lines.append(f"- … and {len(cases) - LISTED} more")
    yield "\n".join(lines) + "\n"


def _case_line(status: str, case: CaseResult, fraction: str, several: bool = False) -> str:
    name = f" — {md(case.name)}" if case.name and case.name != case.id else ""
    if several:
        name = f" @ {md(case.agent or '-')}{name}"
    where = f" ({md(case.file)}:{case.line})" if case.file and case.line else ""
    passed = f" ({fraction} repetitions passed)" if fraction else ""
    cause = f" (cause: {md(case.cause)})" if case.cause else ""
    problem = first_problem(case)
    why = f": {md(problem)}" if problem else ""
    return f"- {_MARKS[status]} **{md(case.id)}**{name}{where}{passed}{cause}{why}"
