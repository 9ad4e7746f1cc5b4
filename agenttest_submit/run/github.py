"""A run's end on GitHub Actions (GITHUB_ACTIONS=true): an error annotation per failed
case at its file and line, the Markdown summary (and the diff against the baseline) in
$GITHUB_STEP_SUMMARY, and the run's id and exit code in $GITHUB_OUTPUT.

The same code ends an embedded run and a fleet's (run/output.py). Annotations are
workflow commands (`::error file=…,line=…,title=…::message`) written to stderr, which
the runner reads as it reads stdout, so that a report written to stdout stays clean.
Case ids, names and problems are untrusted: percent-encoded as the workflow-command
syntax asks (`%`, CR and LF everywhere; `:` and `,` in properties too), so that no
reply can end the line and start a command of its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from agenttest_worker.report import (
    RunDiff,
    RunReport,
    grouped,
    printable,
    problems,
    render,
    render_diff,
)
from agenttest_worker.results import CaseResult

# GitHub shows at most 10 error annotations per step (and 50 per job): each failed
# case is annotated up to this bound, and one more line counts the ones left out.
MAX_ANNOTATIONS = 50


def on_github(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("GITHUB_ACTIONS") == "true"


def command_data(text: str) -> str:
    """A workflow command's message, on one line."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def command_property(text: str) -> str:
    """A workflow command property's value (`file=`, `title=`)."""
    return command_data(text).replace(":", "%3A").replace(",", "%2C")


def _where(case: CaseResult, workspace: Path | None) -> str:
    """`file=…,line=…` relative to the workspace, or nothing when the case's file is not
    in it (a case read from stdin or a generator)."""
    if not case.file or workspace is None:
        return ""
    try:
        relative = Path(case.file).resolve().relative_to(workspace.resolve())
    except (ValueError, OSError):
        return ""
    line = f",line={case.line}" if case.line else ""
    return f"file={command_property(relative.as_posix())}{line},"


def _failed(report: RunReport) -> Iterator[CaseResult]:
    """Each failed case once (a repeated case: its first failed repetition)."""
    tally = report.tally()
    for records in grouped(report.results):
        if tally.add_case(records).status == "failed":
            yield next((r for r in records if r.status == "failed"), records[0])


def annotation_lines(report: RunReport, workspace: Path | None) -> list[str]:
    """The workflow commands for the run's failed cases, at most MAX_ANNOTATIONS errors."""
    lines: list[str] = []
    left_out = 0
    for case in _failed(report):
        if len(lines) == MAX_ANNOTATIONS:
            left_out += 1
            continue
        name = f" {case.name}" if case.name and case.name != case.id else ""
        title = command_property(printable(f"agenttest: {case.id}{name} failed"))
        message = "\n".join(printable(p) for p in problems(case)) or "failed"
        lines.append(f"::error {_where(case, workspace)}title={title}::{command_data(message)}")
    if left_out:
        lines.append(
            f"::warning title=agenttest::{left_out} more failed case(s) not annotated "
            f"(the first {MAX_ANNOTATIONS} are): see the step summary or the report"
        )
    return lines


def _append(path: str | None, text: str) -> None:
    if path:
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(text)


def report_to_github(
    report: RunReport,
    code: int,
    diff: RunDiff | None = None,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Annotations, step summary and step outputs for a run that ended with `code`;
    `diff`: against its baseline (--baseline), added to the summary."""
    workspace = environ.get("GITHUB_WORKSPACE")
    for line in annotation_lines(report, Path(workspace) if workspace else None):
        print(line, file=sys.stderr)
    sys.stderr.flush()
    summary = render("markdown", report)
    if diff is not None:
        summary += "\n" + render_diff(diff, "markdown")
    _append(environ.get("GITHUB_STEP_SUMMARY"), summary + "\n")
    # One value per line: a run id is ours (no newline), the code a number.
    _append(environ.get("GITHUB_OUTPUT"), f"run-id={report.run_id or ''}\nexit-code={code}\n")
