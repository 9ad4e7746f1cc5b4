"""The parser of every subcommand (`SUBCOMMAND_HELP`: status, report, resume, cancel,
runs, diff, history, view, metrics, prune, cache, db, schema, audit-judges, label) and
the requests it builds (request.py); the run's own parser is in main.py. Options a user
pastes from a run (`--config`, `--format`, `-o`) are taken where they mean something and
refused with the reason elsewhere (`PASTED_REASONS`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from agenttest_submit.cli.arg_types import (
    RUN_HELP,
    Parser,
    confidence,
    duration_arg,
    formats,
    port_arg,
    positive_int,
)
from agenttest_submit.cli.audit_args import add_audit_parsers, audit_request
from agenttest_submit.cli.request import (
    SCHEMA_KINDS,
    CacheRequest,
    CancelRequest,
    DbRequest,
    DiffRequest,
    HistoryCommandRequest,
    HistoryRequest,
    MetricsRequest,
    PromoteRequest,
    PruneRequest,
    ReportRequest,
    ResumeRequest,
    RunsRequest,
    SchemaRequest,
    StatusRequest,
    SubcommandRequest,
    ViewRequest,
)
from agenttest_worker.errors import InputError, InputProblem

# Every subcommand: its usage and what it does, for its own parser and for the list in
# `agenttest-submit --help` (main.py), so that the two never disagree.
SUBCOMMAND_HELP: dict[str, tuple[str, str]] = {
    "status": ("status RUN", "counts and state of a run, and what its calls used so far"),
    "report": ("report RUN [-o FILE] [--format F]", "print or write a run's report"),
    "resume": ("resume RUN", "finish a run whose conversations stopped (an outage)"),
    "cancel": (
        "cancel RUN [--reason TEXT]",
        "stop a run under way: its unfinished conversations end skipped",
    ),
    "runs": ("runs [--suite S] [--last N]", "runs, newest first, with their counts"),
    "promote": ("promote RUN", "make a finished run its suite's baseline (--baseline suite)"),
    "diff": (
        "diff [BASE] [NEW] [--format F] | diff RUN --targets A B",
        "what changed between two runs (or two targets of a run), case by case",
    ),
    "history": ("history CASE_ID [--suite S]", "a case's verdict run after run"),
    "view": ("view [RUN] [--port P]", "a local web viewer of the stored runs (writes only labels)"),
    "metrics": (
        "metrics [--port P] [--host H] [--token T]",
        "serve the fleet's progress and queues to Prometheus",
    ),
    "prune": (
        "prune --older-than D [--suite S] [--keep-last N] [--dry-run]",
        "remove old runs that have ended, with all their rows",
    ),
    "cache": (
        "cache stats|clear [--agent NAME] [--older-than D]",
        "the agents' cached replies: how many by agent, or remove them",
    ),
    "audit-judges": (
        "audit-judges RUN [--times N] [--format F] [-o FILE]",
        "ask a run's judges again on the same transcripts: how often they change their minds",
    ),
    "label": (
        "label RUN CASE TURN pass|fail [--note TEXT] [--assertion K]",
        "a person's verdict on a judged assertion, for audit-judges to compare judges with",
    ),
    "db": ("db upgrade", "bring the database to the current schema"),
    "schema": (
        "schema [cases|yaml|config] [-o FILE]",
        "JSON Schema of case files or agenttest.yaml, for editors",
    ),
}
SUBCOMMANDS = tuple(SUBCOMMAND_HELP)


# Options a user pastes from a run's command line into a subcommand that has no use for
# them: accepted by the parser, then refused with the reason (`refused_pasted`).
_CONFIG_READ_FROM_STORE = (
    "{command} reads the store (AGENTTEST_DATABASE_URL, else AGENTTEST_HOME), not "
    "agenttest.yaml: a run's agents and prices are those stored with it when it started"
)
_PRINTS_WHAT_IT_DID = "{command} prints only what it did: redirect it (> FILE)"
PASTED_REASONS: dict[str, dict[str, str]] = {
    "promote": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": "promote marks a run in the store and prints one line",
        "-o": "promote marks a run in the store and prints one line",
    },
    "status": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": "status prints a summary for people; report RUN --format F renders the "
        "run in any format",
        "-o": "status prints to stdout: redirect it (> FILE), or report RUN -o FILE",
    },
    "report": {"--config": _CONFIG_READ_FROM_STORE},
    "resume": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": "resume prints the console report once the run is done; report RUN "
        "--format F renders it in another",
        "-o": "resume prints the console report once the run is done; report RUN -o FILE writes it",
    },
    "cancel": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": _PRINTS_WHAT_IT_DID,
        "-o": _PRINTS_WHAT_IT_DID,
    },
    "runs": {"--config": _CONFIG_READ_FROM_STORE},
    "diff": {"--config": _CONFIG_READ_FROM_STORE},
    "history": {"--config": _CONFIG_READ_FROM_STORE},
    "view": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": "view serves pages; report RUN --format html -o FILE writes one",
        "-o": "view serves pages over HTTP; report RUN -o FILE writes a report",
    },
    "metrics": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": "metrics serves Prometheus' text format, the one format it has",
        "-o": "metrics serves over HTTP; nothing to write",
    },
    "prune": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": _PRINTS_WHAT_IT_DID,
        "-o": _PRINTS_WHAT_IT_DID,
    },
    "cache": {
        "--config": "cache reads the store (AGENTTEST_DATABASE_URL, else AGENTTEST_HOME), "
        "where every project's cached replies are kept, by agent name",
        "--format": _PRINTS_WHAT_IT_DID,
        "-o": _PRINTS_WHAT_IT_DID,
    },
    "audit-judges": {"--config": _CONFIG_READ_FROM_STORE},
    "label": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": _PRINTS_WHAT_IT_DID,
        "-o": _PRINTS_WHAT_IT_DID,
    },
    "db": {
        "--config": _CONFIG_READ_FROM_STORE,
        "--format": _PRINTS_WHAT_IT_DID,
        "-o": _PRINTS_WHAT_IT_DID,
    },
    "schema": {
        "--config": "the schemas are the same for every project (schema config describes "
        "agenttest.yaml itself)",
        "--format": "a schema is a JSON Schema document, the one format it has",
    },
}
_PASTED_FLAGS = {"--config": ("--config",), "--format": ("--format",), "-o": ("-o", "--output")}


def _pasted(command: str, parser: argparse.ArgumentParser) -> None:
    """The options of a run this subcommand has no use for: accepted, refused later."""
    for flag, reason in PASTED_REASONS.get(command, {}).items():
        parser.add_argument(
            *_PASTED_FLAGS[flag],
            dest=f"pasted_{flag.strip('-')}",
            metavar="X",
            default=None,
            help=f"not used: {reason.format(command=command)}",
        )


def refused_pasted(args: argparse.Namespace) -> list[InputProblem]:
    """A problem for each option given that the subcommand has no use for, with why."""
    command = args.command
    return [
        InputProblem(
            f"not used by {command}: {reason.format(command=command)}",
            field="/".join(_PASTED_FLAGS[flag]),
        )
        for flag, reason in PASTED_REASONS.get(command, {}).items()
        if getattr(args, f"pasted_{flag.strip('-')}", None) is not None
    ]


def build_subcommand_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (SUBCOMMAND_HELP)."""
    parser = Parser(prog="agenttest-submit")
    sub = parser.add_subparsers(dest="command", required=True)

    made: dict[str, argparse.ArgumentParser] = {}

    def add(command: str) -> argparse.ArgumentParser:
        what = SUBCOMMAND_HELP[command][1]
        made[command] = sub.add_parser(command, help=what, description=what)
        return made[command]

    status = add("status")
    status.add_argument("run", metavar="RUN", help=RUN_HELP)
    report = add("report")
    report.add_argument("run", metavar="RUN", help=RUN_HELP)
    report.add_argument(
        "-o", "--output", metavar="FILE", help="write the report to FILE (jsonl unless --format)"
    )
    report.add_argument(
        "--format",
        choices=formats(),
        default=None,
        help="report format (default: console on stdout, jsonl in -o)",
    )
    report.add_argument("-v", "--verbose", action="store_true", help="show every turn")
    report.add_argument(
        "--only-failures",
        action="store_true",
        help="console report: show only failed and skipped cases (the summary counts all)",
    )
    resume = add("resume")
    resume.add_argument("run", metavar="RUN", help=RUN_HELP)
    resume.add_argument(
        "--parallel",
        type=positive_int,
        default=10,
        metavar="N",
        help="embedded: conversations at a time (default: 10)",
    )
    cancel = add("cancel")
    cancel.add_argument("run", metavar="RUN", help=RUN_HELP)
    cancel.add_argument(
        "--reason", metavar="TEXT", help="why, shown in its report (default: who cancelled it)"
    )
    prune = add("prune")
    prune.add_argument(
        "--older-than",
        type=duration_arg,
        required=True,
        metavar="DURATION",
        help="runs created longer ago than this: 30d, 12h, ...",
    )
    prune.add_argument("--suite", metavar="NAME", help="only this suite's runs")
    prune.add_argument(
        "--keep-last",
        type=positive_int,
        metavar="N",
        help="keep the newest N runs of each suite, however old",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="list the runs it would remove; remove nothing"
    )
    cache = add("cache")
    cache.add_argument(
        "action",
        choices=("stats", "clear"),
        help="stats: cached replies by agent; clear: remove them",
    )
    cache.add_argument("--agent", metavar="NAME", help="only this agent's replies")
    cache.add_argument(
        "--older-than",
        type=duration_arg,
        metavar="DURATION",
        help="clear: only replies stored longer ago than this: 7d, 12h, ...",
    )
    db = add("db")
    db.add_argument("action", choices=("upgrade",), help="upgrade: apply every migration")
    schema = add("schema")
    schema.add_argument(
        "kind",
        nargs="?",
        choices=SCHEMA_KINDS,
        default="cases",
        help="cases: a JSON case file or a JSONL line (default); yaml: a tdx YAML case "
        "file; config: agenttest.yaml",
    )
    schema.add_argument("-o", "--output", metavar="FILE", help="write the schema to FILE")
    metrics = add("metrics")
    metrics.add_argument(
        "--port", type=port_arg, default=9809, help="port (default: 9809; 0: any free one)"
    )
    metrics.add_argument(
        "--host",
        default="127.0.0.1",
        help="address (default: 127.0.0.1; another, e.g. 0.0.0.0, needs --token)",
    )
    metrics.add_argument(
        "--token",
        default=None,
        help="every scrape must carry it (Bearer, or Basic auth's password); required on a "
        "non-loopback --host (or AGENTTEST_METRICS_TOKEN)",
    )
    _history_parsers(add)
    add_audit_parsers(add)
    view = add("view")
    view.add_argument("run", nargs="?", metavar="RUN", help="open at this run (or last)")
    view.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    view.add_argument("--port", type=port_arg, default=8750, help="port (default: 8750; 0: any)")
    view.add_argument(
        "--token", default=None, help="required on a non-loopback --host (or AGENTTEST_VIEW_TOKEN)"
    )
    for command, command_parser in made.items():
        _pasted(command, command_parser)
    return parser


def _diff_formats() -> tuple[str, ...]:
    # After heap.starting(), as the report formats are (see main.py).
    from agenttest_worker.report import DIFF_FORMATS

    return DIFF_FORMATS


def _history_parsers(add: Callable[[str], argparse.ArgumentParser]) -> None:
    output_help = "write what it prints to FILE"
    diff = add("diff")
    diff.add_argument("runs", nargs="*", metavar="RUN", help="[BASE] [NEW] (NEW: last)")
    diff.add_argument(
        "--window",
        type=positive_int,
        default=10,
        metavar="N",
        help="a case whose verdict changed within the suite's last N runs is flaky (default: 10)",
    )
    diff.add_argument(
        "--confidence",
        type=confidence,
        default=None,
        metavar="P",
        help="only a drop in a case's pass rate significant at P (e.g. 0.95) is a regression",
    )
    diff.add_argument(
        "--history-window",
        type=positive_int,
        default=None,
        metavar="N",
        help="pool each case's plays over the suite's last N finished runs before NEW as "
        "the baseline (implies --confidence 0.95)",
    )
    diff.add_argument(
        "--format",
        choices=_diff_formats(),
        default="console",
        help="console (default), json, markdown (a PR comment) or junit (a CI gate)",
    )
    diff.add_argument(
        "--targets",
        nargs=2,
        metavar=("A", "B"),
        help="compare two targets of one run (-n A -n B): A as the base, B as the new",
    )
    diff.add_argument("-o", "--output", metavar="FILE", help=output_help)
    history = add("history")
    history.add_argument("case_id", metavar="CASE_ID", help="the case's id")
    history.add_argument("--suite", default=None, help="only this suite's runs (default: all)")
    history.add_argument(
        "--last", type=positive_int, default=20, metavar="N", help="the N newest runs (default: 20)"
    )
    history.add_argument(
        "--format", choices=("console", "json"), default="console", help="console or json"
    )
    history.add_argument("-o", "--output", metavar="FILE", help=output_help)
    runs = add("runs")
    runs.add_argument("--suite", default=None, help="only this suite's runs (default: all)")
    runs.add_argument(
        "--last", type=positive_int, default=20, metavar="N", help="the N newest runs (default: 20)"
    )
    runs.add_argument(
        "--format", choices=("console", "json"), default="console", help="console or json"
    )
    runs.add_argument("-o", "--output", metavar="FILE", help=output_help)
    promote = add("promote")
    promote.add_argument("run", metavar="RUN", help=RUN_HELP)


def subcommand_request(
    args: argparse.Namespace,
) -> SubcommandRequest | HistoryCommandRequest | ViewRequest | MetricsRequest:
    """The subcommand `build_subcommand_parser` parsed `args` into."""
    if refused := refused_pasted(args):
        raise InputError(refused)
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
    if args.command == "prune":
        return PruneRequest(
            older_than=args.older_than,
            suite=args.suite,
            keep_last=args.keep_last,
            dry_run=args.dry_run,
        )
    if args.command == "cache":
        if args.action == "stats" and args.older_than is not None:
            raise InputError(
                InputProblem(
                    "cache stats counts every reply; --older-than is for clear",
                    field="--older-than",
                )
            )
        return CacheRequest(action=args.action, agent=args.agent, older_than=args.older_than)
    if args.command in ("audit-judges", "label"):
        return audit_request(args)
    if args.command == "cancel":
        return CancelRequest(run=args.run, reason=args.reason)
    if args.command == "resume":
        return ResumeRequest(run=args.run, parallel=args.parallel)
    if args.command == "schema":
        return SchemaRequest(kind=args.kind, output=args.output)
    if args.command == "metrics":
        return MetricsRequest(port=args.port, host=args.host, token=args.token)
    if args.command == "diff":
        if len(args.runs) > 2:
            raise InputError(InputProblem("diff takes at most two runs: BASE NEW", field="RUN"))
        if args.targets and len(args.runs) > 1:
            raise InputError(
                InputProblem("compares two targets of one run: give one RUN", field="--targets")
            )
        if args.targets and (args.confidence is not None or args.history_window is not None):
            raise InputError(
                InputProblem(
                    "compares verdicts within one run: no --confidence or --history-window",
                    field="--targets",
                )
            )
        runs = list(args.runs)
        new = runs.pop() if runs else "last"
        return DiffRequest(
            new=new,
            base=runs[0] if runs else None,
            window=args.window,
            format=args.format,
            confidence=args.confidence,
            history_window=args.history_window,
            output=args.output,
            targets=tuple(args.targets) if args.targets else None,
        )
    if args.command == "history":
        return HistoryRequest(
            case_id=args.case_id,
            suite=args.suite,
            last=args.last,
            format=args.format,
            output=args.output,
        )
    if args.command == "runs":
        return RunsRequest(suite=args.suite, last=args.last, format=args.format, output=args.output)
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
