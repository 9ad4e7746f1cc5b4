"""`agenttest-submit`: run test cases against agents and exit 0 (all passed), 1 or 2.

    agenttest-submit -i ./tests/expense.jsonl -n assistants.expense
    agenttest-submit -i "Help me file an expense" -n assistants.expense -v
    agenttest-submit -i "agents:workers.test.generator?count=10" -n assistants.expense --dry-run
    agenttest-submit -m "any text at all" -n assistants.expense
    agenttest-submit status RUN | report RUN [-o FILE] | resume RUN | cancel RUN | db upgrade
    agenttest-submit prune --older-than 30d [--suite S] [--keep-last N] [--dry-run]
    agenttest-submit schema [cases|yaml|config]     (JSON Schemas for editors)
    agenttest-submit view [RUN] [--host H --port P --token T]   (web viewer; writes labels)
    (every subcommand: subcommand_args.SUBCOMMAND_HELP, listed by --help)

Exit codes: 0 nothing failed, 1 a case failed, 2 a usage or input error (every problem
listed with file, line and field), 3 the database or the broker out of reach, or an
internal error.

This module reads a run's command line (its parser: run_parser.py; subcommands:
subcommand_args.py): it builds the request (request.py), hands it to `submit.submit` (a
run) or `commands.run_subcommand`, and prints the input problems and the errors they
raise as the exit code says.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from agenttest_submit.cli.exits import EXIT_INPUT, EXIT_INTERNAL
from agenttest_submit.cli.request import (
    DiffRequest,
    HistoryRequest,
    MetricsRequest,
    PromoteRequest,
    RunRequest,
    RunsRequest,
    ViewRequest,
)
from agenttest_submit.cli.run_parser import build_parser, run_request
from agenttest_submit.cli.stopping import (
    interrupted_exit_code,
    interrupted_word,
    sigterm_as_interrupt,
)
from agenttest_submit.cli.subcommand_args import SUBCOMMANDS, parse_subcommand
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.heap import starting

# The rest (pydantic, the report formats, the store) is imported once `main` has called
# heap.starting(): they are start-up's heaviest imports, and the garbage collector's
# passes during them are wasted work (see heap.py).

MAX_PROBLEMS_SHOWN = 200


def parse_run(argv: Sequence[str]) -> RunRequest:
    """`agenttest-submit ARGV` (not a subcommand) as a request; bad usage exits 2."""
    return run_request(build_parser().parse_args(list(argv)))


def main(argv: list[str] | None = None) -> int:
    """The command line `argv` (sys.argv's by default); the exit code (the console
    script's entry point)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    starting()  # see heap.py
    # After heap.starting(): see the note at the top.
    from agenttest_worker.settings import get_settings

    get_settings.cache_clear()  # settings come from this invocation's environment
    debug = os.environ.get("AGENTTEST_DEBUG", "").lower() in ("1", "true", "yes")
    subcommand = bool(args_list) and args_list[0] in SUBCOMMANDS
    try:
        with sigterm_as_interrupt():
            if subcommand:
                command = parse_subcommand(args_list)
                if isinstance(command, ViewRequest):
                    # After heap.starting(); aiohttp's server only for this command.
                    from agenttest_submit.commands.viewer.serve import run_view

                    return run_view(command)
                if isinstance(command, MetricsRequest):
                    # After heap.starting(); prometheus_client only for this command.
                    from agenttest_submit.commands.metrics_exporter import run_metrics_exporter

                    return run_metrics_exporter(command)
                if isinstance(command, DiffRequest | HistoryRequest | RunsRequest | PromoteRequest):
                    # After heap.starting(): see the note at the top.
                    from agenttest_submit.commands.history_commands import run_history_command

                    return run_history_command(command)
                # After heap.starting(): see the note at the top.
                from agenttest_submit.commands.subcommands import run_subcommand

                return run_subcommand(command)
            request = parse_run(args_list)
            warn_about_flags(request)
            from agenttest_submit.run.submit import submit  # after heap.starting(): see the top

            return submit(request)
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
        from agenttest_submit.cli.services import unreachable_service  # after heap.starting()
        from agenttest_worker.report import printable  # after heap.starting()

        # An exception's text may quote a case, a reply or a server's answer: escaped.
        unreachable = unreachable_service(exc)
        if unreachable is not None:
            print(f"agenttest-submit: {printable(unreachable)}", file=sys.stderr)
            return EXIT_INTERNAL
        said = printable(f"{type(exc).__name__}: {exc}")
        print(f"agenttest-submit: internal error: {said}", file=sys.stderr)
        print("(set AGENTTEST_DEBUG=1 to see the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def warn_about_flags(request: RunRequest) -> None:
    """Flags that cannot do what they say here: said on stderr, the run goes on."""
    if request.interactive and not request.skip_interactive and not _stdin_is_terminal():
        print(
            "warning: --interactive: stdin is not a terminal, so nobody can be asked; "
            "each case's on_missing_input decides when an agent awaits input",
            file=sys.stderr,
        )
    from agenttest_worker.settings import get_settings  # after heap.starting()

    if not request.wait and not request.dry_run and not get_settings().distributed:
        print(
            "warning: --no-wait: without AGENTTEST_BROKER_URL this process plays the run, "
            "so it returns when the run has ended; the run id is on stdout, the report on "
            "stderr (or -o)",
            file=sys.stderr,
        )


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # closed, or no stdin at all
        return False


def print_problems(problems: list[InputProblem], nothing_ran: bool = True) -> None:
    count = len(problems)
    noun = "problem" if count == 1 else "problems"
    tail = "; nothing was run" if nothing_ran else ""
    print(f"agenttest-submit: {count} input {noun}{tail}:", file=sys.stderr)
    # A file that is wrong throughout would bury the terminal; the first ones show the
    # pattern, and the count says how many there are.
    # A problem quotes the file (ids, values): escaped, so it cannot command the terminal.
    from agenttest_worker.report import printable  # after heap.starting()

    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        print(f"  {printable(str(problem), keep_lines=True)}", file=sys.stderr)
    if count > MAX_PROBLEMS_SHOWN:
        print(f"  ... and {count - MAX_PROBLEMS_SHOWN} more", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
