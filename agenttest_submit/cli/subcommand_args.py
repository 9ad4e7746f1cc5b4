"""The parser of `agenttest-submit status|report|resume|db|schema ...` and the requests
it builds (request.py); the run's own parser is in main.py."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from agenttest_submit.cli.arg_types import Parser, formats, positive_int
from agenttest_submit.cli.request import (
    SCHEMA_KINDS,
    DbRequest,
    DiffRequest,
    HistoryCommandRequest,
    HistoryRequest,
    MetricsRequest,
    PromoteRequest,
    ReportRequest,
    ResumeRequest,
    RunsRequest,
    SchemaRequest,
    StatusRequest,
    SubcommandRequest,
    ViewRequest,
)
from agenttest_worker.errors import InputError, InputProblem

SUBCOMMANDS = (
    "status",
    "report",
    "resume",
    "db",
    "schema",
    "diff",
    "history",
    "runs",
    "promote",
    "view",
    "metrics",
)


def build_subcommand_parser() -> argparse.ArgumentParser:
    """The parser of `agenttest-submit status|report|resume|db|schema|diff|history|runs`."""
    parser = Parser(prog="agenttest-submit")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="counts and state of a run")
    status.add_argument("run", metavar="RUN")
    report = sub.add_parser("report", help="print or write a run's report")
    report.add_argument("run", metavar="RUN")
    report.add_argument("-o", "--output", metavar="FILE")
    report.add_argument("--format", choices=formats(), default=None)
    report.add_argument("-v", "--verbose", action="store_true")
    report.add_argument(
        "--only-failures",
        action="store_true",
        help="console report: show only failed and skipped cases (the summary counts all)",
    )
    resume = sub.add_parser("resume", help="re-run the unfinished conversations of a run")
    resume.add_argument("run", metavar="RUN")
    resume.add_argument("--parallel", type=positive_int, default=10, metavar="N")
    db = sub.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=("upgrade",))
    schema = sub.add_parser(
        "schema", help="print the JSON Schema of case files or agenttest.yaml, for editors"
    )
    schema.add_argument(
        "kind",
        nargs="?",
        choices=SCHEMA_KINDS,
        default="cases",
        help="cases: a JSON case file or a JSONL line (default); yaml: a tdx YAML case "
        "file; config: agenttest.yaml",
    )
    metrics = sub.add_parser(
        "metrics", help="serve the fleet's run progress and queue lengths to Prometheus"
    )
    metrics.add_argument("--port", type=positive_int, default=9809, help="port (default: 9809)")
    metrics.add_argument("--host", default="0.0.0.0", help="address (default: every address)")
    _history_parsers(sub)
    view = sub.add_parser("view", help="a local read-only web viewer of the stored runs")
    view.add_argument("run", nargs="?", metavar="RUN", help="open at this run (or last)")
    view.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    view.add_argument("--port", type=int, default=8750, help="port (default: 8750; 0: any)")
    view.add_argument(
        "--token", default=None, help="required on a non-loopback --host (or AGENTTEST_VIEW_TOKEN)"
    )
    return parser


def _diff_formats() -> tuple[str, ...]:
    # After heap.starting(), as the report formats are (see main.py).
    from agenttest_worker.report import DIFF_FORMATS

    return DIFF_FORMATS


def _history_parsers(sub: Any) -> None:
    diff = sub.add_parser("diff", help="what changed between two runs, case by case")
    diff.add_argument("runs", nargs="*", metavar="RUN", help="[BASE] [NEW] (NEW: last)")
    diff.add_argument("--window", type=positive_int, default=10, metavar="N")
    diff.add_argument("--format", choices=_diff_formats(), default="console")
    history = sub.add_parser("history", help="a case's verdict run after run")
    history.add_argument("case_id", metavar="CASE_ID")
    history.add_argument("--suite", default=None)
    history.add_argument("--last", type=positive_int, default=20, metavar="N")
    history.add_argument("--format", choices=("console", "json"), default="console")
    runs = sub.add_parser("runs", help="runs, newest first, with their counts")
    runs.add_argument("--suite", default=None)
    runs.add_argument("--last", type=positive_int, default=20, metavar="N")
    runs.add_argument("--format", choices=("console", "json"), default="console")
    promote = sub.add_parser(
        "promote", help="make a finished run its suite's baseline (--baseline suite)"
    )
    promote.add_argument("run", metavar="RUN", help="a run id, or last")


def subcommand_request(
    args: argparse.Namespace,
) -> SubcommandRequest | HistoryCommandRequest | ViewRequest | MetricsRequest:
    """The subcommand `build_subcommand_parser` parsed `args` into."""
    if args.command == "status":
        return StatusRequest(run=args.run)
    if args.command == "report":
        return ReportRequest(
            run=args.run,
            output=args.output,
            format=args.format,
            verbose=args.verbose,
            only_failures=args.only_failures,
        )
    if args.command == "resume":
        return ResumeRequest(run=args.run, parallel=args.parallel)
    if args.command == "schema":
        return SchemaRequest(kind=args.kind)
    if args.command == "metrics":
        return MetricsRequest(port=args.port, host=args.host)
    if args.command == "diff":
        if len(args.runs) > 2:
            raise InputError(InputProblem("diff takes at most two runs: BASE NEW", field="RUN"))
        runs = list(args.runs)
        new = runs.pop() if runs else "last"
        return DiffRequest(
            new=new, base=runs[0] if runs else None, window=args.window, format=args.format
        )
    if args.command == "history":
        return HistoryRequest(
            case_id=args.case_id, suite=args.suite, last=args.last, format=args.format
        )
    if args.command == "runs":
        return RunsRequest(suite=args.suite, last=args.last, format=args.format)
    if args.command == "promote":
        return PromoteRequest(run=args.run)
    if args.command == "view":
        return ViewRequest(run=args.run, host=args.host, port=args.port, token=args.token)
    return DbRequest(action=args.action)


def parse_subcommand(
    argv: Sequence[str],
) -> SubcommandRequest | HistoryCommandRequest | ViewRequest | MetricsRequest:
    """`agenttest-submit status|report|resume|db|schema ...` as a request; bad usage exits 2."""
    return subcommand_request(build_subcommand_parser().parse_args(list(argv)))
