"""Removing old runs with all their rows (`agenttest-submit prune`), a batch at a time.

Only runs that have ended are removed (status `done`), and never one whose stored
conversations a run still under way reads (the parent of a re-evaluation that is
not done). A run's rows go table by table, each in batches of `BATCH_ROWS` committed
on their own, so that no transaction holds locks long or grows with the run while
other runs go on; its `runs` row goes last, so that a run half removed (the process
stopped in between) is still listed, and pruning it again finishes the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, and_, delete, func, not_, select, tuple_
from sqlalchemy.orm import aliased

from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import (
    AgentCallRow,
    AgentSpanRow,
    AssertionResultRow,
    Base,
    CaseRow,
    JudgeAuditRow,
    JudgeLabelRow,
    RunReportRow,
    RunRow,
    TurnRecordRow,
    TurnRow,
)
from agenttest_worker.store.sql.shared import ago

BATCH_ROWS = 5000

# A run's tables, in the order its rows are removed: those that refer to a case first,
# the cases after them, its reports; the run's own row last (see the module docstring).
RUN_TABLES: tuple[type[Base], ...] = (
    TurnRecordRow,
    AssertionResultRow,
    AgentCallRow,
    TurnRow,
    CaseRow,
    RunReportRow,
    JudgeLabelRow,
    JudgeAuditRow,
    AgentSpanRow,
)


@dataclass(frozen=True)
class PrunableRun:
    id: str
    suite: str | None
    created_at: datetime
    total_cases: int
    total_turns: int


def prunable_runs(
    url: str, older_than: float, suite: str | None = None, keep_last: int | None = None
) -> list[PrunableRun]:
    """Runs created more than `older_than` seconds ago that have ended, oldest first;
    only `suite`'s when given; the `keep_last` newest of each suite's ended runs are
    kept."""
    with session_scope(url) as session:
        ranking = select(
            RunRow.id.label("id"),
            func.row_number()
            .over(partition_by=RunRow.suite, order_by=(RunRow.created_at.desc(), RunRow.id.desc()))
            .label("rank"),
        )
        # The newest runs that have ended are kept: one still going is no replacement.
        ranked = ranking.where(RunRow.status == "done").subquery()
        child = aliased(RunRow)
        reading = select(child.id).where(child.parent_run_id == RunRow.id, child.status != "done")
        query = (
            select(
                RunRow.id, RunRow.suite, RunRow.created_at, RunRow.total_cases, RunRow.total_turns
            )
            .join(ranked, ranked.c.id == RunRow.id)
            .where(
                RunRow.status == "done",
                RunRow.created_at < ago(session, older_than),
                not_(reading.exists()),
            )
            .order_by(RunRow.created_at, RunRow.id)
        )
        if suite is not None:
            query = query.where(RunRow.suite == suite)
        if keep_last:
            query = query.where(ranked.c.rank > keep_last)
        return [PrunableRun(*row) for row in session.execute(query)]


def prune_run(url: str, run_id: str, batch: int = BATCH_ROWS) -> dict[str, int]:
    """Remove one ended run and every row of it, a batch at a time; the rows removed by
    table (nothing when it is not an ended run)."""
    with session_scope(url) as session:
        status = session.scalar(select(RunRow.status).where(RunRow.id == run_id))
    if status != "done":
        return {}
    removed: dict[str, int] = {}
    for model in RUN_TABLES:
        table: Table = model.__table__  # type: ignore[assignment]
        key = tuple_(*table.primary_key.columns)
        count = 0
        while True:
            with session_scope(url) as session:
                chosen = (
                    select(*table.primary_key.columns).where(table.c.run_id == run_id).limit(batch)
                )
                gone = session.execute(delete(table).where(key.in_(chosen))).rowcount  # type: ignore[attr-defined]
            count += int(gone or 0)
            if not gone or gone < batch:
                break
        removed[table.name] = count
    with session_scope(url) as session:
        gone = session.execute(
            delete(RunRow).where(and_(RunRow.id == run_id, RunRow.status == "done"))
        ).rowcount  # type: ignore[attr-defined]
    removed["runs"] = int(gone or 0)
    return removed
