"""A run's results: claiming its aggregation once, storing its reports, reading back
its case records, conversations waiting in a phase, and counts of its turns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime

from sqlalchemy import Text, and_, case, cast, delete, func, or_, select, update

from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow, RunReportRow, RunRow, TurnRow
from agenttest_worker.store.sql.report_copy import copy_reports, insert_reports
from agenttest_worker.store.sql.shared import ago, now

# -- aggregation -------------------------------------------------------------------------------


def claim_aggregation(url: str, run_id: str, lease_seconds: float | None = None) -> bool:
    """True for exactly one caller once every conversation of the run has finished.

    The claim is a lease: `finished_at` records when it was taken, and a run left in
    `aggregating` for longer than `lease_seconds` (default: the stall threshold) can be
    claimed again, so an aggregator that died mid-way does not leave the run unfinished
    forever. (A redelivered aggregation task cannot do it: the claim is already taken.)
    """
    lease = get_settings().stall_seconds if lease_seconds is None else lease_seconds
    with session_scope(url) as session:
        result = session.execute(
            update(RunRow)
            .where(
                RunRow.id == run_id,
                RunRow.finished_cases >= RunRow.total_cases,
                or_(
                    RunRow.status == "running",
                    and_(
                        RunRow.status == "aggregating",
                        RunRow.finished_at.is_not(None),
                        RunRow.finished_at < ago(session, lease),
                    ),
                ),
            )
            .values(status="aggregating", finished_at=now(session))
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def complete_run(url: str, run_id: str, reports: Mapping[str, Iterable[str]]) -> None:
    """Store the run's reports (format -> its pieces, as rendered) and mark it done.

    The reports are stored in parts as they are rendered (see report_copy.py): never
    whole here. A caller printing one reads it back a part at a time (`report_parts`).
    """
    with session_scope(url) as session:
        if session.get_bind().dialect.name == "postgresql":
            copy_reports(session, run_id, reports)
        else:
            insert_reports(session, run_id, reports)
        session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(status="done", finished_at=datetime.now(UTC))
        )


# -- reports -----------------------------------------------------------------------------------


def report_parts(url: str, run_id: str, fmt: str) -> Iterator[str]:
    """A stored report's parts, in order, read one at a time (none when it is not
    stored)."""
    part = -1
    while True:
        with session_scope(url) as session:
            row = session.execute(
                select(RunReportRow.part, RunReportRow.content)
                .where(
                    RunReportRow.run_id == run_id,
                    RunReportRow.format == fmt,
                    RunReportRow.part > part,
                )
                .order_by(RunReportRow.part)
                .limit(1)
            ).first()
        if row is None:
            return
        part = row.part
        yield row.content


def get_report(url: str, run_id: str, fmt: str) -> str | None:
    """A stored report, whole (None when it is not stored)."""
    parts = list(report_parts(url, run_id, fmt))
    return "".join(parts) if parts else None


def store_report(url: str, run_id: str, fmt: str, content: str) -> None:
    """Keep one more report with the run (e.g. a reporter agent's), replacing an older one."""
    with session_scope(url) as session:
        session.execute(
            delete(RunReportRow).where(RunReportRow.run_id == run_id, RunReportRow.format == fmt)
        )
        session.add(RunReportRow(run_id=run_id, format=fmt, part=0, content=content))


# -- reading results ---------------------------------------------------------------------------


# Records read per query: a round trip and a session per batch were half of reading a
# 100,000-case run at 500 (benchmarks/aggregate.py). The texts are kept by the caller
# anyway, so a larger batch adds only its row tuples to what is held.
_READ_BATCH = 5000


def iter_results(url: str, run_id: str, batch: int = _READ_BATCH) -> Iterator[CaseResult]:
    """The run's case records in submission order, read in batches."""
    for text in iter_result_texts(url, run_id, batch):
        # Parsed and checked in one pass by pydantic-core: the driver's json.loads and
        # then validating the Python objects took twice as long.
        yield CaseResult.model_validate_json(text)


def iter_result_texts(url: str, run_id: str, batch: int = _READ_BATCH) -> Iterator[str]:
    """The run's case records in submission order, as JSON text, read in batches."""
    last = -1
    while True:
        with session_scope(url) as session:
            rows = session.execute(
                select(CaseRow.seq, cast(CaseRow.result, Text))
                .where(CaseRow.run_id == run_id, CaseRow.seq > last, CaseRow.result.is_not(None))
                .order_by(CaseRow.seq)
                .limit(batch)
            ).all()
        if not rows:
            return
        for seq, result in rows:
            last = seq
            yield result


def count_results(url: str, run_id: str) -> int:
    """How many of the run's conversations have their record (those iter_result_texts
    reads)."""
    with session_scope(url) as session:
        found = session.execute(
            select(func.count())
            .select_from(CaseRow)
            .where(CaseRow.run_id == run_id, CaseRow.result.is_not(None))
        ).scalar_one()
    return int(found)


def flaky_cases(url: str, run_id: str) -> frozenset[str]:
    """The repeated cases of the run one repetition of which passed and another failed
    (their failed repetitions are flakes: report/causes.py). A run of several targets
    weighs each target's repetitions apart: a case that passes on one target and fails
    on another is no flake."""
    passed = func.sum(case((CaseRow.status == "passed", 1), else_=0))
    failed = func.sum(case((CaseRow.status == "failed", 1), else_=0))
    query = (
        select(CaseRow.test_id)
        .where(CaseRow.run_id == run_id, CaseRow.test_id.is_not(None))
        .group_by(CaseRow.test_id, CaseRow.agent)
        .having(and_(passed > 0, failed > 0))
    )
    with session_scope(url) as session:
        return frozenset(str(found) for found in session.scalars(query))


def iter_case_ids(
    url: str, run_id: str, phase: str, batch: int = 1000
) -> Iterator[tuple[str, int]]:
    """(case_id, next_turn) of the run's conversations in a phase, in submission order."""
    last = -1
    while True:
        with session_scope(url) as session:
            rows = session.execute(
                select(CaseRow.seq, CaseRow.case_id, CaseRow.next_turn)
                .where(CaseRow.run_id == run_id, CaseRow.phase == phase, CaseRow.seq > last)
                .order_by(CaseRow.seq)
                .limit(batch)
            ).all()
        if not rows:
            return
        for seq, case_id, next_turn in rows:
            last = seq
            yield case_id, next_turn


def count_turn_rows(url: str, run_id: str) -> list[tuple[str, int, int]]:
    """(case_id, turn, rows) for every recorded turn: what fault tests check for doubles."""
    with session_scope(url) as session:
        rows = session.execute(
            select(TurnRow.case_id, TurnRow.turn, func.count())
            .where(TurnRow.run_id == run_id)
            .group_by(TurnRow.case_id, TurnRow.turn)
        ).all()
        return [(c, t, n) for c, t, n in rows]


def count_played_turns(url: str, run_id: str) -> int:
    """Turns played and recorded so far, in finished conversations or not (the run's
    `total_turns` counts those of finished conversations only)."""
    with session_scope(url) as session:
        found = session.execute(
            select(func.count())
            .select_from(TurnRow)
            .where(TurnRow.run_id == run_id, TurnRow.input.is_not(None))
        ).scalar_one()
        return int(found)
