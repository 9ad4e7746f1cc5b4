"""A run's report where the user asked for it: stdout, `-o FILE`, a reporter agent.

`emit_report` renders the run's report in the `--format` chosen (console on stdout by
default, jsonl in -o), writes it, sends it to the `--reporter` agent, records the
golden conversations (`--update-golden`), and says the exit code; whether -o can be
written is checked before anything runs (cli/output_file.py).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agenttest_submit.cli.exits import EXIT_FAILED, EXIT_INPUT, EXIT_OK
from agenttest_submit.cli.request import RunRequest
from agenttest_submit.cli.terminal import color_wanted
from agenttest_submit.run.github import on_github, report_to_github
from agenttest_submit.run.golden_update import say_written, write_golden
from agenttest_submit.run.reporter_agent import run_reporter
from agenttest_worker.agents import AgentError, ProjectConfig, config_from_stored
from agenttest_worker.errors import InputError
from agenttest_worker.report import (
    STORED_FORMATS,
    RunDiff,
    RunReport,
    printable,
    render_chunks,
    worded_diff,
)


def _pieces(
    fmt: str, report: RunReport, stored: Callable[[str], Iterator[str]] | None
) -> Iterator[str]:
    """The report in `fmt`, a piece at a time: read back as the aggregator stored it
    (`stored`, when it was rendered with these options), else rendered now."""
    parts = iter(stored(fmt)) if stored is not None and fmt in STORED_FORMATS else iter(())
    first = next(parts, None)
    if first is not None:
        yield first
        yield from parts
        return
    yield from render_chunks(fmt, report)


def emit_report(url: str, run_id: str, request: RunRequest, built: RunReport | None = None) -> int:
    """Print the report (console unless --format says otherwise), write -o, exit code.

    `built` is the aggregator's report when this process just built it: the results
    are not read from the store a second time. An embedded run (`built`) and a fleet's
    (read here) get the same options: --only-failures means the same on both.
    """
    color = color_wanted(sys.stdout)
    # The store (SQLAlchemy) is imported where it is used: see embedded.run_embedded.
    from agenttest_worker.store import results

    stored: Callable[[str], Iterator[str]] | None = None
    if built is not None:
        report = built
        # What the aggregator just stored, rendered with the defaults.
        stored = functools.partial(results.report_parts, url, run_id)
    else:
        from agenttest_worker.report import build_report

        report = build_report(url, run_id)
    chosen = (request.verbose, color, request.only_failures)
    if (report.verbose, report.color, report.only_failures) != chosen:
        report.verbose, report.color, report.only_failures = chosen
        stored = None
    if request.baseline and request.format == "html":
        # The page shows what changed since the baseline the run is compared with.
        report.baseline_diff = baseline_diff(url, run_id, request.baseline)
    stdout_format = request.format if request.format and not request.output else "console"
    for piece in _pieces(stdout_format, report, stored):
        sys.stdout.write(piece)
    sys.stdout.flush()
    if request.output:
        if report.color:
            report.color, stored = False, None
        try:
            with Path(request.output).open("w", encoding="utf-8") as out:
                for piece in _pieces(request.format or "jsonl", report, stored):
                    out.write(piece)
        except OSError as exc:
            # Checked before the run started; this is the disk filling up or the like.
            print(
                f"agenttest-submit: cannot write {request.output}: {exc.strerror or exc}; the "
                f"results are stored: agenttest-submit report {run_id} -o FILE",
                file=sys.stderr,
            )
            return EXIT_INPUT
        print(f"results written to {request.output} (run {run_id})", file=sys.stderr)
    if request.reporter:
        _custom_report(url, run_id, request.reporter, report)
    if request.update_golden:
        say_written(write_golden(report.results))
    summary = report.summary()
    code = EXIT_FAILED if summary.run_failed else EXIT_OK
    found: RunDiff | None = None
    if request.baseline:
        # After the report: what changed since the baseline, and --fail-on's exit code.
        from agenttest_submit.commands.history_commands import (
            Gate,
            print_baseline_diff,  # the store: see above
        )
        from agenttest_submit.commands.run_diffs import weighing_of

        weighing = weighing_of(request.confidence, request.history_window)
        gate = Gate(request.baseline, request.fail_on, code, summary.stopped, weighing)
        code, found = print_baseline_diff(url, run_id, gate)
    if on_github():
        report_to_github(report, code, found)
    return code


def baseline_diff(url: str, run_id: str, baseline: str) -> dict[str, Any] | None:
    """The run's diff against `baseline` (--baseline) as the `diff` command's JSON; None
    when there is no baseline to compare with (the end of the run says why)."""
    # The store (SQLAlchemy) is imported where it is used: see embedded.run_embedded.
    from agenttest_submit.commands.run_diffs import build_diff, resolve_baseline
    from agenttest_submit.run.runner import resolve_run

    new = resolve_run(url, run_id)
    try:
        base = resolve_baseline(url, baseline, new)
    except InputError:
        return None
    return worded_diff(build_diff(url, base, new).as_dict())


def _custom_report(url: str, run_id: str, use: str, report: RunReport) -> None:
    """--reporter: the reporter agent's account, stored with the run and printed."""
    # The store (SQLAlchemy) is imported where it is used: see embedded.run_embedded.
    from agenttest_worker.store import results, runs

    run = runs.get_run(url, run_id)
    config = config_from_stored(run.config) if run is not None else ProjectConfig()
    try:
        text = run_reporter(use, report, config, url)
    except AgentError as exc:
        # The run's own results stand; only the extra report is missing.
        print(f"warning: reporter {use} failed: {printable(exc.message)}", file=sys.stderr)
        return
    results.store_report(url, run_id, "reporter", text)
    sys.stdout.write(reporter_section(text, use))
    sys.stdout.flush()


def reporter_section(text: str, use: str | None = None) -> str:
    """A reporter agent's account as printed after the report (`use`: which agent, when
    known; `report RUN` reads only what it wrote)."""
    # The reporter agent's words are data: printed with their lines, escapes made visible.
    shown = printable(text.rstrip(), keep_lines=True)
    return f"\n── Report by {use or 'the reporter agent'} ──\n{shown}\n"
