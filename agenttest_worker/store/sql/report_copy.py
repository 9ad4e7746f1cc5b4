"""Storing a run's reports as they are rendered, without holding them whole.

The reports of a nightly run are large (tens of megabytes of JSONL and console text
for tens of thousands of cases, hundreds for a million). Built as strings and inserted,
each existed several times over in the process that aggregated the run: its pieces,
the joined text and the driver's encoded copy (benchmarks/aggregate.py). Instead they
are rendered side by side and stored in parts of about a megabyte (run_reports.part),
as they come. A report already stored (a second aggregator whose claim overlapped) is
kept whole: on Postgres the parts go with COPY into a temporary table first, then into
run_reports for the formats not stored yet; on SQLite (an embedded run's own file,
one writer at a time) the formats stored already are skipped.
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
    session.execute(
        text(
            "INSERT INTO run_reports (run_id, format, part, content)"
            " SELECT CAST(:run AS varchar), format, part, content FROM agenttest_new_reports AS new"
            " WHERE NOT EXISTS (SELECT 1 FROM run_reports AS stored"
            "  WHERE stored.run_id = CAST(:run AS varchar) AND stored.format = new.format)"
        ),
        {"run": run_id},
    )


def insert_reports(session: Session, run_id: str, reports: Mapping[str, Iterable[str]]) -> None:
    """The same as copy_reports, on SQLite."""
    stored = set(
        session.execute(
            text("SELECT DISTINCT format FROM run_reports WHERE run_id = :run"), {"run": run_id}
        ).scalars()
    )
    insert = text(
        "INSERT INTO run_reports (run_id, format, part, content, created_at)"
        " VALUES (:run, :format, :part, :content, CURRENT_TIMESTAMP)"
    )
    for fmt, part, content in interleaved_parts(reports):
        if fmt not in stored:
            session.execute(
                insert, {"run": run_id, "format": fmt, "part": part, "content": content}
            )
