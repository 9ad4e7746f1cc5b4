"""`agenttest-submit`: run test cases against agents and exit 0 (all passed), 1 or 2.

    agenttest-submit -i ./tests/expense.jsonl -n assistants.expense
    agenttest-submit -i "Help me file an expense" -n assistants.expense -v
    agenttest-submit -i "agents:workers.test.generator?count=10" -n assistants.expense --dry-run
    agenttest-submit status RUN | report RUN [-o FILE] | resume RUN | db upgrade

Exit codes: 0 nothing failed, 1 a case failed, 2 a usage or input error (every problem
listed with file, line and field), 3 the database or the broker out of reach, or an
internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from agenttest_submit.stopping import (
    interrupted_exit_code,
    interrupted_word,
    sigterm_as_interrupt,
)
from agenttest_worker.durations import parse_duration
from agenttest_worker.errors import InputError, InputProblem

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
MAX_PROBLEMS_SHOWN = 200
SUBCOMMANDS = ("status", "report", "resume", "db")
# `--simulator` given alone: agenttest.yaml's defaults.simulator.
DEFAULT_SIMULATOR = "\0defaults.simulator"
FORMATS = ("console", "json", "jsonl", "table", "tsv", "junit")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit is 2 too; keep the wording
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT)


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="agenttest-submit",
        description="Run scripted and simulated conversations against agents and check every turn.",
        epilog="Subcommands: status RUN, report RUN [-o FILE] [--format F], resume RUN, "
        "db upgrade.",
    )
    p.add_argument(
        "-i",
        "--input",
        action="append",
        default=[],
        metavar="SOURCE",
        help="case file or folder, a message, agents:ID?k=v or scripts:ID?k=v (repeatable)",
    )
    p.add_argument("-n", "--name", metavar="AGENT", help="target agent (a name in agenttest.yaml)")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write results (or, with --dry-run, the normalized cases) to FILE",
    )
    p.add_argument(
        "-c",
        "--connector",
        metavar="AGENT",
        help="call this registry agent instead of the target's own entry",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show every turn")
    p.add_argument(
        "--interactive", action="store_true", help="ask at the terminal when an agent awaits input"
    )
    p.add_argument(
        "--skip-interactive",
        action="store_true",
        help="never ask at the terminal (CI); on_missing_input decides",
    )
    p.add_argument(
        "--simulator",
        metavar="REF",
        nargs="?",
        const=DEFAULT_SIMULATOR,
        help="simulator for cases without one (agents:ID or scripts:ID; alone: "
        "defaults.simulator of agenttest.yaml)",
    )
    p.add_argument(
        "--timeout",
        type=_duration_arg,
        default=300.0,
        metavar="DURATION",
        help="timeout per test case (default: 5m)",
    )
    p.add_argument(
        "--parallel",
        type=_positive_int,
        default=10,
        metavar="N",
        help="conversations run at a time (default: 10)",
    )
    p.add_argument("--fail-fast", action="store_true", help="stop on the first failure")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="load, generate and check cases, print them, call no target",
    )
    p.add_argument("--config", metavar="FILE", help="agenttest.yaml (default: ./agenttest.yaml)")
    p.add_argument(
        "--on-missing-input",
        choices=("skip", "fail", "end"),
        help="override every case's on_missing_input",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="report format on stdout or -o (default: console on stdout, jsonl in -o)",
    )
    p.add_argument("--tag", action="append", default=[], help="run only cases with this tag")
    p.add_argument(
        "--id",
        action="append",
        default=[],
        dest="ids",
        metavar="ID",
        help="run only the case with this id (repeatable)",
    )
    p.add_argument(
        "--wait",
        dest="wait",
        action="store_true",
        default=True,
        help="distributed: wait for the run and print its report (default)",
    )
    p.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="distributed: print the run id and return at once",
    )
    p.add_argument(
        "--reeval",
        nargs="?",
        const="last",
        default=None,
        metavar="RUN",
        help="re-run assertions on stored conversations without calling the target",
    )
    p.add_argument("--reporter", metavar="REF", help="send the results to a reporter agent")
    p.add_argument(
        "--turn-timeout",
        type=_duration_arg,
        default=None,
        metavar="DURATION",
        help="timeout per turn: the target, its tool calls, judges and the simulator together",
    )
    p.add_argument(
        "--deadline",
        type=_duration_arg,
        default=None,
        metavar="DURATION",
        help="stop the whole run after this long",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="start no new turn once the run's agent calls used this many tokens",
    )
    p.add_argument(
        "--max-cost",
        type=_positive_float,
        default=None,
        metavar="AMOUNT",
        help="start no new turn once the run cost this much (agents' `pricing`)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    from agenttest_worker.heap import starting

    starting()  # see heap.py
    from agenttest_worker.settings import get_settings

    get_settings.cache_clear()  # settings come from this invocation's environment
    debug = os.environ.get("AGENTTEST_DEBUG", "").lower() in ("1", "true", "yes")
    subcommand = bool(args_list) and args_list[0] in SUBCOMMANDS
    try:
        with sigterm_as_interrupt():
            if subcommand:
                from agenttest_submit.commands import run_subcommand

                return run_subcommand(args_list)
            args = build_parser().parse_args(args_list)
            return run_main(args)
    except InputError as exc:
        print_problems(exc.problems, nothing_ran=not subcommand)
        return EXIT_INPUT
    except KeyboardInterrupt as exc:
        print(interrupted_word(exc), file=sys.stderr)
        return interrupted_exit_code(exc)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_INPUT
    except Exception as exc:
        if debug:
            raise
        from agenttest_submit.services import unreachable_service

        unreachable = unreachable_service(exc)
        if unreachable is not None:
            print(f"agenttest-submit: {unreachable}", file=sys.stderr)
            return EXIT_INTERNAL
        print(f"agenttest-submit: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("(set AGENTTEST_DEBUG=1 to see the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def print_problems(problems: list[InputProblem], nothing_ran: bool = True) -> None:
    count = len(problems)
    noun = "problem" if count == 1 else "problems"
    tail = "; nothing was run" if nothing_ran else ""
    print(f"agenttest-submit: {count} input {noun}{tail}:", file=sys.stderr)
    # A file that is wrong throughout would bury the terminal; the first ones show the
    # pattern, and the count says how many there are.
    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        print(f"  {problem}", file=sys.stderr)
    if count > MAX_PROBLEMS_SHOWN:
        print(f"  ... and {count - MAX_PROBLEMS_SHOWN} more", file=sys.stderr)


def parse_inputs(values: list[str]) -> tuple[list[Any], list[InputProblem]]:
    """Every -i value classified, with the problems of all of them (not just the first)."""
    from dataclasses import replace

    from agenttest_submit.inputs import MessageInput, parse_input

    sources: list[Any] = []
    problems: list[InputProblem] = []
    messages = 0
    for value in values:
        try:
            source = parse_input(value)
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        if isinstance(source, MessageInput):
            messages += 1
            source = replace(source, number=messages)
        sources.append(source)
    return sources, problems


def output_problem(output: str | None, flag: str = "-o") -> InputProblem | None:
    """Why `output` cannot be written, found before anything runs (not after an hour)."""
    if not output:
        return None
    path = Path(output).expanduser()
    folder = path.parent
    if path.is_dir():
        why = "it is a folder; give a file name"
    elif not folder.is_dir():
        why = f"folder {folder} does not exist"
    elif not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = "permission denied"
    else:
        return None
    return InputProblem(f"cannot write {output}: {why}", field=flag)


def run_main(args: argparse.Namespace) -> int:
    from agenttest_submit.expand import CaseStream, Selection, print_warnings
    from agenttest_worker.agents.config import load_config

    if args.interactive and args.skip_interactive:
        raise InputError("--interactive and --skip-interactive contradict each other")
    config = load_config(args.config)
    bad_output = output_problem(args.output)
    if args.reeval is not None and not args.input:
        if bad_output:
            raise InputError(bad_output)
        from agenttest_submit.reeval import reeval_run

        return reeval_run(args, config)
    if not args.input:
        raise InputError('no input: give -i FILE, -i "a message" or -i agents:/scripts:GENERATOR')
    sources, problems = parse_inputs(args.input)
    target = args.name or config.defaults.agent
    if bad_output:
        problems.append(bad_output)
    for flag, ref in (("-n", args.name), ("-c", args.connector)):
        if ref is not None and ref not in config.agents:
            problems.append(InputProblem(config.unknown_agent_message(ref), field=flag))
    if args.simulator == DEFAULT_SIMULATOR:
        args.simulator = config.defaults.simulator
        if args.simulator is None:
            problems.append(
                InputProblem(
                    "names no simulator, and agenttest.yaml has no defaults.simulator",
                    field="--simulator",
                )
            )
    if args.simulator is not None:
        from agenttest_worker.cases.checks import check_ref

        if message := check_ref(config, args.simulator, "simulator"):
            problems.append(InputProblem(message, field="--simulator"))
    from agenttest_submit.reporter_agent import reporter_problem

    if reporter := reporter_problem(config, args.reporter):
        problems.append(reporter)  # not found out after the whole run
    if problems:
        raise InputError(problems)
    from agenttest_submit.inputs import MessageInput

    if any(isinstance(s, MessageInput) for s in sources) and target is None:
        raise InputError(
            InputProblem("a direct message needs a target agent: add -n NAME", field="-i")
        )
    stream = CaseStream(
        sources,
        config,
        target=target,
        simulator=args.simulator,
        selection=Selection(tags=args.tag, ids=args.ids),
    )
    if args.dry_run:
        return _dry_run(stream, args.output)
    if args.reeval is not None:
        from agenttest_submit.reeval import reeval_cases

        cases = list(stream)
        stream.finish()
        print_warnings(stream.warnings)
        return reeval_cases(args, config, cases)
    from agenttest_submit.runner import run_cases

    return run_cases(args, config, stream, sources, target)


def _dry_run(stream: Any, output: str | None) -> int:
    """Print (or write) the normalized cases, only once all of them proved valid."""
    from agenttest_submit.expand import Spool, print_warnings

    with Spool(stream, None) as spool:
        print_warnings(stream.warnings)
        lines = (json.dumps(record, ensure_ascii=False) + "\n" for _, _, record in spool.records())
        if output:
            with Path(output).open("w", encoding="utf-8") as handle:
                handle.writelines(lines)
            where = f" written to {output}"
        else:
            sys.stdout.writelines(lines)
            where = ""
    print(f"{stream.count} case(s){where} (dry run: no target was called)", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
