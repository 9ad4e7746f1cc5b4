"""The parsers of `audit-judges` and `label` (their usage lines are in
subcommand_args.py's one table) and the requests they build."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from agenttest_submit.cli.arg_types import RUN_HELP, positive_int
from agenttest_submit.cli.request import (
    AUDIT_TIMES,
    AUDIT_TIMES_MAX,
    AuditRequest,
    LabelRequest,
)


def _times(text: str) -> int:
    times = positive_int(text)
    if times > AUDIT_TIMES_MAX:
        raise argparse.ArgumentTypeError(f"at most {AUDIT_TIMES_MAX}, not {times}")
    return times


def _turn(text: str) -> int:
    if text == "final":
        return 0
    return positive_int(text)


def add_audit_parsers(add: Callable[[str], argparse.ArgumentParser]) -> None:
    audit = add("audit-judges")
    audit.add_argument("run", metavar="RUN", help=RUN_HELP)
    audit.add_argument(
        "--times",
        type=_times,
        default=AUDIT_TIMES,
        metavar="N",
        help=f"ask each judge N more times (default: {AUDIT_TIMES}; at most {AUDIT_TIMES_MAX})",
    )
    audit.add_argument(
        "--format", choices=("console", "json"), default="console", help="console or json"
    )
    audit.add_argument("-o", "--output", metavar="FILE", help="write the audit to FILE")
    audit.add_argument(
        "--parallel",
        type=positive_int,
        default=10,
        metavar="N",
        help="conversations judged again at a time (default: 10)",
    )
    label = add("label")
    label.add_argument("run", metavar="RUN", help=RUN_HELP)
    label.add_argument("case_id", metavar="CASE", help="the case's id (a repetition's: ID#N)")
    label.add_argument(
        "turn", type=_turn, metavar="TURN", help="the turn's number, or final (final assertions)"
    )
    label.add_argument("label", choices=("pass", "fail"), help="what the verdict should be")
    label.add_argument("--note", metavar="TEXT", help="why, kept with the label")
    label.add_argument(
        "--assertion",
        type=positive_int,
        metavar="K",
        help="the K-th assertion of the turn (needed when it has more than one judged one)",
    )
    label.add_argument("--by", metavar="NAME", help="who labels (default: USER@HOST)")


def audit_request(args: argparse.Namespace) -> AuditRequest | LabelRequest:
    if args.command == "audit-judges":
        return AuditRequest(
            run=args.run,
            times=args.times,
            format=args.format,
            output=args.output,
            parallel=args.parallel,
        )
    return LabelRequest(
        run=args.run,
        case_id=args.case_id,
        turn=args.turn,
        label=args.label == "pass",
        note=args.note,
        assertion=args.assertion,
        by=args.by,
    )
