"""The parser of a run (`agenttest-submit -i ... [options]`) and the request it builds:
the one place argparse's names for a run are read. Subcommands have theirs in
subcommand_args.py; the argument types are in arg_types.py.
"""

from __future__ import annotations

import argparse
from typing import Any

from agenttest_submit.cli.arg_types import (
    Once,
    Parser,
    confidence,
    duration_arg,
    fail_on,
    formats,
    max_repeat_arg,
    pass_rule,
    positive_float,
    positive_int,
    repeat_arg,
)
from agenttest_submit.cli.request import (
    DEFAULT_MAX_REPEAT,
    DEFAULT_SIMULATOR,
    RERUN_DEFAULT,
    Rerun,
    RunRequest,
)
from agenttest_submit.cli.subcommand_args import SUBCOMMAND_HELP
from agenttest_worker.errors import ConfigError, InputError, InputProblem


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # only when parsing

    try:
        return version("agenttest")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


EXAMPLES = """\
examples:
  agenttest-submit -i ./tests/expense.jsonl -n assistants.expense
  agenttest-submit -i ./tests/ -n assistants.expense -o results.jsonl --format jsonl
  agenttest-submit -m "Help me file an expense" -n assistants.expense -v
  generate-cases | agenttest-submit -i - -n assistants.expense
  RUN=$(agenttest-submit -i ./tests/ -n assistants.expense --no-wait)   # on a fleet
  agenttest-submit status $RUN; agenttest-submit report $RUN --format junit -o junit.xml
  agenttest-submit cancel $RUN --reason "wrong build"
  agenttest-submit -i ./tests/ -n assistants.expense --rerun-failed last   # only what failed
  agenttest-submit prune --older-than 30d --keep-last 10 --dry-run
"""


def subcommands_epilog() -> str:
    """Every subcommand with what it does, then examples: the end of `--help`."""
    width = 36  # a longer usage has its line to itself, the description under it
    lines = ["subcommands (agenttest-submit COMMAND --help for each; RUN is a run id or last):"]
    for usage, what in SUBCOMMAND_HELP.values():
        if len(usage) > width:
            lines += [f"  {usage}", f"  {'':<{width}}  {what}"]
        else:
            lines.append(f"  {usage:<{width}}  {what}")
    return "\n".join(lines) + "\n\n" + EXAMPLES


def build_parser() -> argparse.ArgumentParser:
    """The parser of a run: `agenttest-submit -i ... [options]`."""
    p = Parser(
        prog="agenttest-submit",
        description="Run scripted and simulated conversations against agents and check every "
        "turn; or, with a subcommand, read and manage the runs stored.",
        epilog=subcommands_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-i",
        "--input",
        action="append",
        default=[],
        metavar="SOURCE",
        help="case file or folder, - (JSONL cases on standard input), a message, "
        "agents:ID?k=v or scripts:ID?k=v (repeatable); a missing path is an error, not a message",
    )
    p.add_argument(
        "-m",
        "--message",
        action="append",
        default=[],
        dest="messages",
        metavar="TEXT",
        help="send TEXT to the target as a single-turn case, whatever it looks like (repeatable)",
    )
    p.add_argument(
        "-n",
        "--name",
        metavar="AGENT",
        help="target agent (a name in agenttest.yaml); given more than once, every case is "
        "played against each target and the reports compare them",
        action="append",
    )
    p.add_argument(
        "-o",
        "--output",
        action=Once,
        metavar="FILE",
        help="write results (or, with --dry-run, the normalized cases) to FILE",
    )
    p.add_argument(
        "-c",
        "--connector",
        action=Once,
        metavar="AGENT",
        help="call this registry agent instead of the target's own entry",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show every turn")
    p.add_argument(
        "--only-failures",
        action="store_true",
        help="console report: show only failed and skipped cases (the summary counts all)",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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
        action=Once,
        metavar="REF",
        nargs="?",
        const=DEFAULT_SIMULATOR,
        help="simulator for cases without one (agents:ID or scripts:ID; alone: "
        "defaults.simulator of agenttest.yaml)",
    )
    p.add_argument(
        "--timeout",
        action=Once,
        type=duration_arg,
        default=300.0,
        metavar="DURATION",
        help="timeout per test case (default: 5m)",
    )
    p.add_argument(
        "--parallel",
        action=Once,
        type=positive_int,
        default=None,
        metavar="N",
        help="conversations run at a time (default: 10; on a fleet: no cap)",
    )
    p.add_argument("--fail-fast", action="store_true", help="stop on the first failure")
    caching = p.add_mutually_exclusive_group()
    caching.add_argument(
        "--no-cache",
        action="store_true",
        help="call every agent, serving no reply from the reply cache and storing none",
    )
    caching.add_argument(
        "--cache-refresh",
        action="store_true",
        help="call the agents whose replies are cached again, and store their new replies",
    )
    p.add_argument(
        "--cache",
        action=Once,
        choices=["target"],
        default=None,
        metavar="ROLE",
        help="cache the target's replies too (target); judges, simulators and generators "
        "with temperature 0 or a seed are cached by default",
    )
    p.add_argument(
        "--repeat",
        action=Once,
        type=repeat_arg,
        default=None,
        metavar="K",
        help="play each case K times as independent conversations (overrides a case's "
        "repeat); auto: until its pass rate is clearly on one side of the pass rule, at "
        "most --max-repeat times",
    )
    p.add_argument(
        "--max-repeat",
        action=Once,
        type=max_repeat_arg,
        default=None,
        metavar="K",
        help=f"with --repeat auto: play each case at most K times (default {DEFAULT_MAX_REPEAT})",
    )
    p.add_argument(
        "--pass-rule",
        action=Once,
        type=pass_rule,
        default="all",
        metavar="RULE",
        help="a repeated case passes when all (default), any, a majority, or a share such as "
        "0.8 of its repetitions passed",
    )
    p.add_argument(
        "--suite",
        action=Once,
        default=None,
        metavar="NAME",
        help="the series of runs this run belongs to (default: from the inputs and the target)",
    )
    p.add_argument(
        "--baseline",
        action=Once,
        default=None,
        metavar="RUN",
        help="after the report, the diff against RUN: a run id, last, or suite (the suite's "
        "previous finished run)",
    )
    p.add_argument(
        "--fail-on",
        action=Once,
        type=fail_on,
        default=("any",),
        metavar="WHAT",
        help="exit 1 on any failed case (any, the default), or only on what the diff against "
        "the baseline (--baseline, default suite) finds: regressions (cases that passed "
        "there and fail now), new (new or changed cases that fail), or both: regressions,new",
    )
    p.add_argument(
        "--confidence",
        action=Once,
        type=confidence,
        default=None,
        metavar="P",
        help="weigh each case's pass rates in the diff against the baseline: only a drop "
        "significant at P (e.g. 0.95; one-sided Fisher exact test) is a regression, one "
        "that is not is 'likely regressed' and fails nothing (default with "
        "--history-window: 0.95; implies --baseline suite)",
    )
    p.add_argument(
        "--history-window",
        action=Once,
        type=positive_int,
        default=None,
        metavar="N",
        help="pool each case's plays over the suite's last N finished runs as the baseline "
        "of the noise-aware gate (implies --confidence 0.95)",
    )
    p.add_argument(
        "--pass-k",
        action=Once,
        type=positive_int,
        default=None,
        metavar="k",
        help="the k of the run's pass@k and pass^k (default: each case's repetitions)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="load, generate and check cases, print them, call no target",
    )
    p.add_argument(
        "--config", metavar="FILE", help="agenttest.yaml (default: ./agenttest.yaml)", action=Once
    )
    p.add_argument(
        "--on-missing-input",
        action=Once,
        choices=("skip", "fail", "end"),
        help="override every case's on_missing_input",
    )
    p.add_argument(
        "--format",
        action=Once,
        choices=formats(),
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
        action=Once,
        nargs="?",
        const="last",
        default=None,
        metavar="RUN",
        help="re-run assertions on stored conversations without calling the target",
    )
    for flag, which in (("--rerun-failed", "failed"), ("--rerun-skipped", "were skipped")):
        p.add_argument(
            flag,
            action=Once,
            nargs="?",
            const=RERUN_DEFAULT,
            default=None,
            metavar="RUN",
            help=f"run only the cases of the inputs that {which} in RUN: a run id, or last (the "
            "newest finished run); alone: --suite's newest finished run, else last",
        )
    p.add_argument(
        "--reporter", metavar="REF", help="send the results to a reporter agent", action=Once
    )
    p.add_argument(
        "--turn-timeout",
        action=Once,
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="timeout per turn: the target, its tool calls, judges and the simulator together",
    )
    p.add_argument(
        "--deadline",
        action=Once,
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="stop the whole run after this long",
    )
    p.add_argument(
        "--max-tokens",
        action=Once,
        type=positive_int,
        default=None,
        metavar="N",
        help="start no new turn once the run's agent calls used this many tokens",
    )
    p.add_argument(
        "--max-cost",
        action=Once,
        type=positive_float,
        default=None,
        metavar="AMOUNT",
        help="start no new turn once the run cost this much (agents' `pricing`)",
    )
    golden = p.add_mutually_exclusive_group()
    golden.add_argument(
        "--golden",
        action=Once,
        nargs="?",
        const="tools",
        choices=("exact", "tools", "judge"),
        default=None,
        metavar="MATCH",
        help="compare every case with its golden conversation (<case file>.golden/<id>.json): "
        "exact, tools (the default) or judge",
    )
    golden.add_argument(
        "--update-golden",
        action="store_true",
        help="record each passing case's conversation as its golden conversation",
    )
    return p


def _repeats(
    repeat: int | str | None, max_repeat: int | None, reeval: str | None
) -> dict[str, Any]:
    """--repeat and --max-repeat as the request's fields: with `auto`, `repeat` is the
    most each case is played."""
    if repeat == "auto" and reeval is not None:
        # Re-judging plays no repetition it could stop: a run's are re-judged as stored.
        raise ConfigError(
            InputProblem(
                "--repeat auto decides how often cases are played; --reeval plays none: "
                "re-judge without --repeat (every stored repetition is re-judged)",
                field="--repeat",
            )
        )
    if repeat == "auto":
        return {"repeat": max_repeat or DEFAULT_MAX_REPEAT, "repeat_auto": True}
    if max_repeat is not None:
        raise ConfigError(
            InputProblem("--max-repeat bounds --repeat auto: give both", field="--max-repeat")
        )
    return {"repeat": repeat}


def run_request(args: argparse.Namespace) -> RunRequest:
    """The run `build_parser` parsed `args` into: the one place argparse's names are read."""
    # The same target twice is one target.
    names = list(dict.fromkeys(args.name or ()))
    return RunRequest(
        inputs=tuple(args.input),
        messages=tuple(args.messages),
        agent=names[0] if names else None,
        targets=tuple(names) if len(names) > 1 else (),
        connector=args.connector,
        config_file=args.config,
        output=args.output,
        format=args.format,
        verbose=args.verbose,
        only_failures=args.only_failures,
        interactive=args.interactive,
        skip_interactive=args.skip_interactive,
        simulator=args.simulator,
        on_missing_input=args.on_missing_input,
        tags=tuple(args.tag),
        ids=tuple(args.ids),
        case_timeout=args.timeout,
        turn_timeout=args.turn_timeout,
        deadline=args.deadline,
        max_tokens=args.max_tokens,
        max_cost=args.max_cost,
        parallel=args.parallel or 10,
        parallel_given=args.parallel is not None,
        fail_fast=args.fail_fast,
        cache="off" if args.no_cache else "refresh" if args.cache_refresh else "on",
        cache_target=args.cache == "target",
        **_repeats(args.repeat, args.max_repeat, args.reeval),
        pass_rule=args.pass_rule,
        pass_k=args.pass_k,
        suite=args.suite,
        # The gate and its weighing compare with a baseline: the suite's unless given.
        baseline=args.baseline
        or (
            "suite" if args.fail_on != ("any",) or args.confidence or args.history_window else None
        ),
        fail_on=args.fail_on,
        confidence=args.confidence,
        history_window=args.history_window,
        dry_run=args.dry_run,
        wait=args.wait,
        reeval=args.reeval,
        rerun=_rerun(args.rerun_failed, args.rerun_skipped),
        reporter=args.reporter,
        golden=args.golden,
        update_golden=args.update_golden,
    )


def _rerun(failed: str | None, skipped: str | None) -> Rerun | None:
    """--rerun-failed and --rerun-skipped as one request: both read one run (a value
    given to either names it for both)."""
    if failed is None and skipped is None:
        return None
    named = list(dict.fromkeys(v for v in (failed, skipped) if v not in (None, RERUN_DEFAULT)))
    if len(named) > 1:
        raise InputError(
            InputProblem(
                f"names run {named[1]!r} and --rerun-failed run {named[0]!r}: "
                "both read one run; give it once",
                field="--rerun-skipped",
            )
        )
    return Rerun(named[0] if named else RERUN_DEFAULT, failed is not None, skipped is not None)
