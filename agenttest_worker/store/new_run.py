"""A new run and its cases on their way into the store, and how Postgres takes a batch
of cases.

Without SQLAlchemy: a submitter stores its run on Postgres through psycopg alone
(postgres_run.py), and the SQLAlchemy store (runs.py) writes a batch of cases the same
way, on the driver connection of its session.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from agenttest_worker.store.steps import CaseText
from agenttest_worker.store.storable import dumps_storable, storable_json

if TYPE_CHECKING:
    from psycopg import Connection


def submitted_by() -> str:
    """Who submits a run: user@host."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# Batches of cases a run's writes store at once on Postgres, each on its own
# connection: enough to keep a two-core server busy (agenttest_submit/storing.py).
POSTGRES_WRITERS = 2


@dataclass(frozen=True)
class NewRun:
    """A run row as its submitter creates it (the rest of its columns take their
    defaults). `usage`: what the run used before it was stored (its generators;
    store/usage.py)."""

    run_id: str
    agent: str | None
    input_label: str
    options: dict[str, Any]
    config: dict[str, Any]
    parent_run_id: str | None = None
    deadline_at: float | None = None
    suite: str | None = None
    usage: dict[str, Any] | None = None


class RunWrites(Protocol):
    """Where a new run is written: psycopg alone on Postgres (postgres_run.py), the
    SQLAlchemy store elsewhere (runs.SqlAlchemyRunWrites). The store's schema is current
    before the first of these is called."""

    # Batches of cases written at once (each on its own connection).
    writers: int

    def create_run(self, run: NewRun) -> None: ...

    def add_cases(self, run_id: str, batch: Sequence[NewCase]) -> int: ...

    def start_run(self, run_id: str, total: int, started_at: datetime | None = None) -> bool:
        """The run running with `total` cases; whether they have all ended already."""
        ...

    def delete_run(self, run_id: str) -> None: ...

    def keep_statistics(self, total: int) -> None:
        """Have the database plan with statistics that know a run of `total` cases
        (`statistics_behind`); nothing where the database needs none."""
        ...

    def close(self) -> None: ...


# Not frozen, for the same reason as cases.validation.Located: one per case stored.
@dataclass(slots=True)
class NewCase:
    seq: int
    case_id: str
    # The normalized record, or its text as the submitter's spool holds it.
    case: dict[str, Any] | CaseText
    agent: str | None

    @property
    def test_id(self) -> str | None:
        """A repetition's case id (the record says which repetition it is); else None."""
        if isinstance(self.case, CaseText):
            return self.case.test_id
        return self.case.get("id") if "repetition" in self.case else None


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


# On Postgres a batch of cases is written with COPY, each case's record as the text the
# spool holds: the server neither parses, plans nor answers a statement per row, nor
# takes the batch apart as a JSON array (the INSERT ... SELECT over
# json_array_elements below, which took ~40% longer per batch and the submitter
# twice the CPU: benchmarks/RESULTS.md, "Submission, 2026-12-02, later"). The columns
# and values are the ORM insert's (its defaults written out).
COPY_CASES = (
    'COPY cases (run_id, case_id, test_id, seq, "case", agent, phase, next_turn,'
    " deliveries, reserved_tokens, reserved_cost) FROM STDIN"
)

# COPY has no conflict rule: a batch holding a case already stored (never one the
# submitter writes: its ids are checked unique, its run new) is written again with this
# statement, which keeps the stored row, as the ORM insert would.
ADD_CASES = (
    'INSERT INTO cases (run_id, case_id, test_id, seq, "case", agent, phase, next_turn,'
    " deliveries, reserved_tokens, reserved_cost)"
    " SELECT %(run_id)s, e->>0, e->>1, CAST(e->>2 AS integer), e->4, e->>3,"
    " 'pending', 1, 0, 0, 0"
    " FROM json_array_elements(CAST(%(cases)s AS json)) AS e"
    " ON CONFLICT DO NOTHING"
)


def record_text(case: NewCase) -> str:
    """The case's record as the column's type writes it (storable.py), or as given."""
    if isinstance(case.case, CaseText):
        return storable_json(case.case.text)
    return dumps_storable(case.case)


def _case_element(case: NewCase) -> str:
    """[case id, test id, seq, agent, record] as JSON (for `ADD_CASES`)."""
    head = json.dumps([case.case_id, case.test_id, case.seq, case.agent])
    return f"{head[:-1]}, {record_text(case)}]"


def _copy_value(value: str | None) -> str:
    return "\\N" if value is None else copy_escaped(value)


def copy_rows(run_id: str, batch: Sequence[NewCase]) -> str:
    """The batch as COPY's text format, one line per case (see `COPY_CASES`)."""
    run = copy_escaped(run_id)
    return "".join(
        f"{run}\t{copy_escaped(c.case_id)}\t{_copy_value(c.test_id)}\t{c.seq}\t"
        f"{copy_escaped(record_text(c))}\t{_copy_value(c.agent)}\tpending\t1\t0\t0\t0\n"
        for c in batch
    )


def write_cases(connection: Connection[Any], run_id: str, batch: Sequence[NewCase]) -> int:
    """Store `batch` on a psycopg connection, in a transaction of its own (a savepoint
    inside one already open); the number of cases given."""
    from psycopg.errors import UniqueViolation  # psycopg: only where Postgres is used

    try:
        with (
            connection.transaction(),
            connection.cursor() as cursor,
            cursor.copy(COPY_CASES) as copy,
        ):
            copy.write(copy_rows(run_id, batch))
        return len(batch)
    except UniqueViolation:
        pass  # a case already stored: see `ADD_CASES`
    document = "[" + ", ".join(map(_case_element, batch)) + "]"
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute(ADD_CASES, {"run_id": run_id, "cases": document})
    return len(batch)


# Postgres plans each conversation's statements (its load, its step's save) by the
# cases table's statistics. Without any (a table never analyzed: a new database, or
# autovacuum off) or with statistics from before a run larger than all the table held,
# every index leading with run_id looks like one row, and Postgres may take the smallest
# instead of the primary key: each statement then reads every case of the run, and a
# run of 10,000 conversations in flight kept the database's core busy with its own
# saves (benchmarks/RESULTS.md). A run that outnumbers what the statistics know has the
# table analyzed once it has started (its conversations replan as it commits).
# (reltuples: the rows the statistics know; -1 for none.)
KNOWN_CASES = "SELECT reltuples FROM pg_class WHERE oid = to_regclass('cases')"
ANALYZE_CASES = "ANALYZE cases"


def statistics_behind(known: Any, total: int) -> bool:
    """Whether statistics knowing `known` cases (KNOWN_CASES's row) are behind a run of
    `total` (see above)."""
    return known is not None and float(known[0]) < total
