"""Storing a run's reports as they are rendered, without holding them whole.

The reports of a nightly run are large (tens of megabytes of JSONL and console text
for tens of thousands of cases). Built as strings and inserted, each existed several times over in
the worker that aggregated the run: its pieces, the joined text and the driver's encoded
copy (benchmarks/aggregate.py). On Postgres the reports are instead streamed to the
server side by side, in parts of about a megabyte, with COPY, into a temporary table
first, then joined by the server into run_reports, so that a report already stored (a
second aggregator whose claim overlapped) is kept, as an INSERT ... ON CONFLICT DO
NOTHING would. Elsewhere (SQLite, an embedded run's own file) the pieces are joined
and inserted (results.complete_run).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from sqlalchemy import text
from sqlalchemy.orm import Session

from agenttest_worker.store.sql.runs import copy_escaped

# Pieces are gathered up to this many characters before each write to the server.
_WRITE_CHARS = 1 << 20


def interleaved_parts(reports: Mapping[str, Iterable[str]]) -> Iterator[tuple[str, int, str]]:
    """(format, part number, text) of every report, rendered side by side: a piece of
    each in turn, gathered into parts of about _WRITE_CHARS characters. Rendered one
    after the other, each report parsed every record again; side by side they share the
    records just parsed (report/report_model.py StoredResults). Every format has a part 0, so
    an empty report is still stored."""
    rendering = {fmt: iter(pieces) for fmt, pieces in reports.items()}
    waiting: dict[str, list[str]] = {fmt: [] for fmt in rendering}
    sizes = dict.fromkeys(rendering, 0)
    parts = dict.fromkeys(rendering, 0)
    while rendering:
        for fmt, pieces in list(rendering.items()):
            piece = next(pieces, None)
            if piece is not None:
                waiting[fmt].append(piece)
                sizes[fmt] += len(piece)
            if piece is None or sizes[fmt] >= _WRITE_CHARS:
                yield fmt, parts[fmt], "".join(waiting[fmt])
                parts[fmt] += 1
                waiting[fmt], sizes[fmt] = [], 0
            if piece is None:
                del rendering[fmt]


def copy_reports(session: Session, run_id: str, reports: Mapping[str, Iterable[str]]) -> None:
    """Store each report (format -> its pieces) with the run, on Postgres, in the
    session's transaction, leaving any already stored in that format as it is."""
    session.execute(
        text(
            "CREATE TEMPORARY TABLE agenttest_new_reports"
            " (format text, part integer, content text) ON COMMIT DROP"
        )
    )
    driver = session.connection().connection.driver_connection
    assert driver is not None  # a live connection of this session's transaction
    copying = "COPY agenttest_new_reports (format, part, content) FROM STDIN"
    with driver.cursor() as cursor, cursor.copy(copying) as copy:
        for fmt, part, content in interleaved_parts(reports):
            copy.write(f"{copy_escaped(fmt)}\t{part}\t{copy_escaped(content)}\n")
    # The parts are joined by the server, in order: the report is never whole here.
    session.execute(
        text(
            "INSERT INTO run_reports (run_id, format, content)"
            " SELECT :run, format, string_agg(content, '' ORDER BY part)"
            " FROM agenttest_new_reports GROUP BY format"
            " ON CONFLICT DO NOTHING"
        ),
        {"run": run_id},
    )
