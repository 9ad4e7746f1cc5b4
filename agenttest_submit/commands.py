"""Subcommands: `status RUN`, `report RUN`, `resume RUN`, `db upgrade`.

RUN is a run id as printed when the run started, or `last` for the newest run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agenttest_submit.services import safe_url
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.settings import get_settings
from agenttest_worker.store import repo
from agenttest_worker.store.db import upgrade
from agenttest_worker.store.models import RunRow

FORMATS = ("console", "json", "jsonl", "table", "tsv", "junit")


def _parser() -> argparse.ArgumentParser:
    from agenttest_submit.cli import _Parser, _positive_int

    parser = _Parser(prog="agenttest-submit")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="counts and state of a run")
    status.add_argument("run", metavar="RUN")
    report = sub.add_parser("report", help="print or write a run's report")
    report.add_argument("run", metavar="RUN")
    report.add_argument("-o", "--output", metavar="FILE")
    report.add_argument("--format", choices=FORMATS, default=None)
    report.add_argument("-v", "--verbose", action="store_true")
    resume = sub.add_parser("resume", help="re-run the unfinished conversations of a run")
    resume.add_argument("run", metavar="RUN")
    resume.add_argument("--parallel", type=_positive_int, default=10, metavar="N")
    db = sub.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=("upgrade",))
    return parser


def _url() -> str:
    url = get_settings().effective_database_url()
    upgrade(url)
    return url


def resolve_run(url: str, ref: str) -> RunRow:
    run = repo.latest_run(url) if ref == "last" else repo.get_run(url, ref)
    if run is None:
        what = "no runs yet" if ref == "last" else f"no run {ref!r}"
        raise InputError(InputProblem(f"{what} in {safe_url(url)}", field="RUN"))
    return run


def run_subcommand(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "db":
        url = get_settings().effective_database_url()
        upgrade(url)
        print(f"database {safe_url(url)} is at the current schema")
        return 0
    if args.command == "report":
        from agenttest_submit.cli import output_problem

        if problem := output_problem(args.output):
            raise InputError(problem)
    url = _url()
    run = resolve_run(url, args.run)
    if args.command == "status":
        from agenttest_worker.store import repo

        print(status_text(run, repo.count_played_turns(url, run.id)))
        return 0
    if args.command == "report":
        code = _report(url, run.id, args)
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
    from agenttest_submit.resume import resume_run

    return resume_run(url, run, args.parallel)


def _cases_total(run: RunRow) -> str:
    # A run still being stored does not know its number of cases yet.
    return "?" if run.status == "pending" else str(run.total_cases)


def status_text(run: RunRow, played: int | None = None) -> str:
    """What `status` prints; `played`: the turns recorded so far, finished cases or not."""
    cancelled = f" (cancelled: {run.cancel_reason or ''})" if run.cancelled else ""
    lines = [
        f"run       {run.id}",
        f"status    {run.status}{cancelled}",
        f"agent     {run.agent or '-'}",
        f"input     {run.input_label or '-'}",
        f"by        {run.submitted_by or '-'} at {run.created_at:%Y-%m-%d %H:%M:%S}",
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


def _report(url: str, run_id: str, args: argparse.Namespace) -> int:
    from agenttest_worker.fleet.aggregate import build_report
    from agenttest_worker.report import render

    report = build_report(url, run_id, verbose=args.verbose, color=sys.stdout.isatty())
    if args.output:
        report.color = False
        Path(args.output).write_text(render(args.format or "jsonl", report), encoding="utf-8")
        print(f"report written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(render(args.format or "console", report))
    return 1 if report.summary().failed else 0
