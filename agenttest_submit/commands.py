"""Subcommands: `status RUN`, `report RUN`, `resume RUN`, `db upgrade`, `schema [KIND]`.

RUN is a run id as printed when the run started, or `last` for the newest run.
`run_subcommand` carries out the request the command line was parsed into.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agenttest_submit.output import output_problem
from agenttest_submit.request import (
    DbRequest,
    ReportRequest,
    ResumeRequest,
    SchemaRequest,
    StatusRequest,
    SubcommandRequest,
)
from agenttest_submit.resume import resume_run
from agenttest_submit.runner import resolve_run
from agenttest_submit.schema import schema_text
from agenttest_submit.services import safe_url
from agenttest_submit.terminal import color_wanted
from agenttest_worker.errors import InputError
from agenttest_worker.fleet.aggregate import build_report
from agenttest_worker.report import render
from agenttest_worker.report.common import printable
from agenttest_worker.settings import get_settings
from agenttest_worker.store import results
from agenttest_worker.store.db import upgrade
from agenttest_worker.store.models import RunRow


def _url() -> str:
    url = get_settings().effective_database_url()
    upgrade(url)
    return url


def run_subcommand(request: SubcommandRequest) -> int:
    if isinstance(request, SchemaRequest):
        # For editors on any machine: no database, broker or agenttest.yaml involved.
        sys.stdout.write(schema_text(request.kind))
        return 0
    if isinstance(request, DbRequest):
        url = get_settings().effective_database_url()
        upgrade(url)
        print(f"database {safe_url(url)} is at the current schema")
        return 0
    if isinstance(request, ReportRequest) and (problem := output_problem(request.output)):
        raise InputError(problem)
    url = _url()
    run = resolve_run(url, request.run)
    if isinstance(request, StatusRequest):
        print(status_text(run, results.count_played_turns(url, run.id)))
        return 0
    if isinstance(request, ReportRequest):
        code = _report(url, run.id, request)
        if run.status != "done":
            # A CI job that publishes the report too early must not pass quietly.
            print(
                f"agenttest-submit: run {run.id} is {run.status} "
                f"({run.finished_cases}/{_cases_total(run)} cases finished): "
                "the report covers only the finished ones",
                file=sys.stderr,
            )
            return max(code, 1)
        return code
    assert isinstance(request, ResumeRequest)
    return resume_run(url, run, request.parallel)


def _cases_total(run: RunRow) -> str:
    # A run still being stored does not know its number of cases yet.
    return "?" if run.status == "pending" else str(run.total_cases)


def status_text(run: RunRow, played: int | None = None) -> str:
    """What `status` prints; `played`: the turns recorded so far, finished cases or not."""
    # The label quotes the inputs (a message given with -i), the reason may quote an
    # error: escaped, like everything else from the run that reaches the terminal.
    cancelled = f" (cancelled: {printable(run.cancel_reason or '')})" if run.cancelled else ""
    lines = [
        f"run       {run.id}",
        f"status    {run.status}{cancelled}",
        f"agent     {printable(run.agent or '-')}",
        f"input     {printable(run.input_label or '-')}",
        f"suite     {printable(run.suite or '-')}",
        f"by        {printable(run.submitted_by or '-')} at {run.created_at:%Y-%m-%d %H:%M:%S}",
        f"cases     {run.finished_cases}/{_cases_total(run)} finished: {run.passed} passed, "
        f"{run.failed} failed, {run.skipped} skipped",
        f"turns     {run.total_turns}"
        + (
            f" in finished cases, {played} played"
            if played is not None and played != run.total_turns
            else ""
        ),
    ]
    if run.parent_run_id:
        lines.append(f"from      {run.parent_run_id}")
    return "\n".join(lines)


def _report(url: str, run_id: str, request: ReportRequest) -> int:
    report = build_report(url, run_id, verbose=request.verbose, color=color_wanted(sys.stdout))
    # Only the console reads it; -o and other formats keep every case, as on a run.
    report.only_failures = request.only_failures
    if request.output:
        report.color = False
        text = render(request.format or "jsonl", report)
        Path(request.output).write_text(text, encoding="utf-8")
        print(f"report written to {request.output}", file=sys.stderr)
    else:
        sys.stdout.write(render(request.format or "console", report))
    return 1 if report.summary().failed else 0
