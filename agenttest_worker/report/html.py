"""HTML: one self-contained page (no network: inline style and script, no fonts or CDN)
with the run's summary, its cases as a table that filters by status and tag and
searches text, and each case's conversation as a chat.

The records are embedded as JSON (html_page/data.py) and rendered by the page as they
are looked at: the table a few hundred rows at a time, a conversation when it is
opened. A run of 10,000 three-turn cases makes a file under twice its JSONL's size
(benchmarks/html_report.py) that opens without rendering 10,000 conversations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from agenttest_worker.report.html_page.data import (
    RunData,
    diff_words,
    record_notes,
    script_text,
    sort_rows,
)
from agenttest_worker.report.html_page.shell import data_element, data_open, page_end, page_start
from agenttest_worker.report.html_page.waterfall import trace_notes
from agenttest_worker.report.report_model import RunReport
from agenttest_worker.report.verdicts import grouped
from agenttest_worker.results import CaseResult

# Records per chunk: a streamed report is written in pieces of about this many records.
_CHUNK = 200


def render(run: RunReport) -> str:
    return "".join(render_chunks(run))


def render_chunks(run: RunReport) -> Iterator[str]:
    """The page piece by piece; the records are read once, in the run's order."""
    title = f"{run.title} · run {run.run_id}" if run.run_id else run.title
    yield page_start(title, {"page": "report"})
    # [[record, notes], ...] in the run's order; the rows point into it.
    yield data_open("agenttest-records") + "["
    data = RunData(run)
    yield from _records(run, data)
    yield "]</script>\n"
    yield data_element("agenttest-run", {"run": data.header(), "rows": sort_rows(data.rows)})
    if run.baseline_diff is not None:
        # What changed since the baseline (--baseline), shown above the summary.
        yield data_element("agenttest-diff", {**run.baseline_diff, **diff_words()})
    yield page_end()


def _records(run: RunReport, data: RunData) -> Iterable[str]:
    pieces: list[str] = []
    index = 0
    for records in grouped(run.results):
        data.add(records, index)
        for record in records:
            pieces.append(_pair(record, run, first=index == 0))
            index += 1
        if len(pieces) >= _CHUNK:
            yield "".join(pieces)
            pieces = []
    yield "".join(pieces)


def _pair(record: CaseResult, run: RunReport, *, first: bool) -> str:
    notes = record_notes(record, simulated=record.id in run.simulators)
    notes.update(trace_notes(record, run.agent_spans.get(record.trace_id or "")))
    text = f"[{record.to_json_line()},{json.dumps(notes, ensure_ascii=False)}]"
    return ("" if first else ",") + script_text(text)
