"""Storing a run's reports as they are rendered, without holding them whole.

The reports of a nightly run are large (30,000 cases: ~26 MB of JSONL and ~12 MB of
console text). Built as strings and inserted, each existed several times over in the
worker that aggregated the run: its pieces, the joined text and the driver's encoded
copy (benchmarks/aggregate.py). On Postgres each report is instead streamed to the
server piece by piece with COPY, into a temporary table first so that a report already
stored (a second aggregator whose claim overlapped) is kept, as an INSERT ... ON
CONFLICT DO NOTHING would. Elsewhere (SQLite, an embedded run's own file) the pieces
are joined and inserted (results.complete_run).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

# Pieces are gathered up to this many characters before each write to the server.
_WRITE_CHARS = 1 << 20


def copy_escaped(piece: str) -> str:
    """`piece` as a field of COPY's text format (a NUL, which Postgres text cannot hold,
    as U+FFFD, like the records it comes from)."""
    return (
        piece.replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
        .replace("\x00", "\ufffd")
    )


def _stream(copy: Any, fmt: str, pieces: Iterable[str]) -> None:
    copy.write(f"{copy_escaped(fmt)}\t")
    waiting: list[str] = []
    size = 0
    for piece in pieces:
        waiting.append(piece)
        size += len(piece)
        if size >= _WRITE_CHARS:
            copy.write(copy_escaped("".join(waiting)))
            waiting, size = [], 0
    copy.write(copy_escaped("".join(waiting)) + "\n")


def copy_reports(session: Session, run_id: str, reports: Mapping[str, Iterable[str]]) -> None:
    """Store each report (format -> its pieces) with the run, on Postgres, in the
    session's transaction, leaving any already stored in that format as it is."""
    session.execute(
        text(
            "CREATE TEMPORARY TABLE agenttest_new_reports (format text, content text)"
            " ON COMMIT DROP"
        )
    )
    driver = session.connection().connection.driver_connection
    assert driver is not None  # a live connection of this session's transaction
    copying = "COPY agenttest_new_reports (format, content) FROM STDIN"
    with driver.cursor() as cursor, cursor.copy(copying) as copy:
        for fmt, pieces in reports.items():
            _stream(copy, fmt, pieces)
    session.execute(
        text(
            "INSERT INTO run_reports (run_id, format, content)"
            " SELECT :run, format, content FROM agenttest_new_reports"
            " ON CONFLICT DO NOTHING"
        ),
        {"run": run_id},
    )
