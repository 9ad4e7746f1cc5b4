"""The report formats' registry: each format by the name users write (`--format`).

Reporters are pure: a RunReport in, text out; writing it to stdout or `-o` is the
caller's business, which keeps every format testable without files or terminals.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from agenttest_worker.report import console, html, jsonl, junit, markdown_report, table, tsv
from agenttest_worker.report import json as json_report
from agenttest_worker.report.report_model import RunReport


class Reporter(Protocol):
    """A report format. Each format module satisfies it with its module-level render()."""

    def render(self, run: RunReport) -> str: ...


class ChunkedReporter(Reporter, Protocol):
    """A format that can also be written as it is built: `render_chunks` yields pieces
    whose concatenation is `render`'s text (the aggregator streams such reports to the
    store instead of holding them whole)."""

    def render_chunks(self, run: RunReport) -> Iterator[str]: ...


REPORTERS: dict[str, Reporter] = {
    "console": console,
    "json": json_report,
    "jsonl": jsonl,
    "table": table,
    "tsv": tsv,
    "junit": junit,
    "html": html,
    "markdown": markdown_report,
}


def register(name: str, reporter: Reporter) -> None:
    """Add a report format (for plugins); a name is registered once."""
    if name in REPORTERS:
        raise ValueError(f"report format {name!r} registered twice")
    REPORTERS[name] = reporter


def _reporter(format: str) -> Reporter:
    try:
        return REPORTERS[format]
    except KeyError:
        known = ", ".join(sorted(REPORTERS))
        raise ValueError(f"unknown report format {format!r} (choose from: {known})") from None


def render(format: str, run: RunReport) -> str:
    """The run's report in `format`; an unknown name lists the known ones."""
    return _reporter(format).render(run)


def render_chunks(format: str, run: RunReport) -> Iterator[str]:
    """The run's report in `format` piece by piece (in one piece for a format that is
    not a ChunkedReporter)."""
    reporter = _reporter(format)
    pieces = getattr(reporter, "render_chunks", None)
    if pieces is None:
        yield reporter.render(run)
        return
    yield from pieces(run)
