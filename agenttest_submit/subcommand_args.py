"""The parser of `agenttest-submit status|report|resume|db|schema ...` and the requests
it builds (request.py); the run's own parser is in cli.py."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from agenttest_submit.arg_types import Parser, formats, positive_int
from agenttest_submit.request import (
    SCHEMA_KINDS,
    DbRequest,
    ReportRequest,
    ResumeRequest,
    SchemaRequest,
    StatusRequest,
    SubcommandRequest,
)

SUBCOMMANDS = ("status", "report", "resume", "db", "schema")


def build_subcommand_parser() -> argparse.ArgumentParser:
    """The parser of `agenttest-submit status|report|resume|db|schema ...`."""
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
    return parser


def subcommand_request(args: argparse.Namespace) -> SubcommandRequest:
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
    return DbRequest(action=args.action)


def parse_subcommand(argv: Sequence[str]) -> SubcommandRequest:
    """`agenttest-submit status|report|resume|db|schema ...` as a request; bad usage exits 2."""
    return subcommand_request(build_subcommand_parser().parse_args(list(argv)))
