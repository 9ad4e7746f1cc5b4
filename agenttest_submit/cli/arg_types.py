"""What the parsers of `agenttest-submit` share: the parser class (exit 2 on bad usage,
as for bad input), the report format choices, and the argument types."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agenttest_submit.cli.exits import EXIT_INPUT
from agenttest_worker.durations import parse_duration
from agenttest_worker.errors import InputError, InputProblem


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit is 2 too; keep the wording
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT)


class Once(argparse.Action):
    """An option that takes one value: given twice with different values, an input error
    naming both (argparse's own `store` silently keeps the last, so `-n A -n B` ran
    against B without a word). The same value twice is what the user meant: kept."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        before = getattr(namespace, self.dest, None)
        given = f"{self.dest}_given_once"
        if getattr(namespace, given, False) and before != values:
            flags = "/".join(self.option_strings)
            raise InputError(
                InputProblem(
                    f"given twice, {before!r} and {values!r}: give it once",
                    field=flags,
                )
            )
        setattr(namespace, given, True)
        setattr(namespace, self.dest, values)


# What every RUN argument takes.
RUN_HELP = "a run id as printed when it started, or last (the newest run)"


def formats() -> list[str]:
    """The `--format` choices: every format in the report registry, as registered now."""
    from agenttest_worker.report import REPORTERS  # after heap.starting(): see the top

    return list(REPORTERS)


def duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def pass_rule(text: str) -> str:
    from agenttest_worker.report import pass_rule_problem  # after heap.starting()

    problem = pass_rule_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def confidence(text: str) -> float:
    """`--confidence`: a level strictly between 0 and 1 (0.95)."""
    from agenttest_worker.report import confidence_problem  # after heap.starting()

    problem = confidence_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return float(text)


def port_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is 0 (any free one) to 65535")
    return value


# The most --max-repeat may be: a case's repetitions are read together, in memory.
MAX_REPEAT_BOUND = 1000


def repeat_arg(text: str) -> int | str:
    """--repeat: a number of repetitions, or `auto`."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a number of repetitions, or auto)") from None


def max_repeat_arg(text: str) -> int:
    """--max-repeat: at least 2 (one repetition decides nothing), at most MAX_REPEAT_BOUND."""
    value = positive_int(text)
    if not 2 <= value <= MAX_REPEAT_BOUND:
        raise argparse.ArgumentTypeError(f"must be from 2 to {MAX_REPEAT_BOUND}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


# What `--fail-on` may list: `any` (the run's own exit code) alone, or the diff's
# categories that fail the job.
FAIL_ON_DIFF = ("regressions", "new")


def fail_on(text: str) -> tuple[str, ...]:
    """`--fail-on`: `any`, or a comma-separated list of `regressions` and `new`."""
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if chosen == ("any",):
        return chosen
    unknown = [part for part in chosen if part not in FAIL_ON_DIFF]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give any, or one or more of {', '.join(FAIL_ON_DIFF)} "
            "separated by commas (regressions,new)"
        )
    return chosen
