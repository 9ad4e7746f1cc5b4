"""Recovering from lost messages: what the sweeper asks the store (fleet/sweeper.py,
"Recovering lost messages").

Runs whose submitter died while storing them are closed, conversations of stalled runs
are claimed to be enqueued again, and runs whose aggregation never happened are found;
each claim is a guarded UPDATE, so among several sweepers exactly one acts on it. And a
batch of first turns starts only the conversations that have not started yet
(`pending_case_ids`), so a redelivered `agenttest.start` starts none twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session

from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import reconnecting, session_scope
from agenttest_worker.store.sql.models import CaseRow, RunRow
from agenttest_worker.store.sql.shared import ago


def _stalled_runs(session: Session, stall_seconds: float, run_id: str | None) -> Any:
    """Running runs none of whose conversations moved (turn started or saved) lately."""
    query = (
        select(CaseRow.run_id)
        .join(RunRow, RunRow.id == CaseRow.run_id)
        .where(RunRow.status == "running")
        .group_by(CaseRow.run_id)
        .having(func.max(CaseRow.updated_at) < ago(session, stall_seconds))
    )
    if run_id is not None:
        query = query.where(CaseRow.run_id == run_id)
    return query


def _nothing_moved_since(cutoff: Any) -> ColumnElement[bool]:
    """For a query on runs: none of the run's conversations was stored or moved since
    `cutoff` (or it has none)."""
    moved = (
        select(func.max(CaseRow.updated_at)).where(CaseRow.run_id == RunRow.id).scalar_subquery()
    )
    return or_(moved.is_(None), moved < cutoff)


ABANDONED_REASON = (
    "its submitter stopped while storing the run, after {stored} case(s); "
    "the rest of the input was never stored"
)


@dataclass(frozen=True)
class ClosedRun:
    run_id: str
    stored: int


def close_abandoned_runs(
    url: str, stall_seconds: float, run_id: str | None = None
) -> list[ClosedRun]:
    """Runs left `pending` by a submitter that died while storing them, closed.

    A run stays `pending` until its submitter has stored every case (`start_run`); one
    killed outright in between (SIGKILL, the out-of-memory killer; SIGTERM and Ctrl-C
    remove the run) leaves it so for ever, with part of its cases, some of them already
    started. Such a run, created more than `stall_seconds` ago and with nothing stored
    or moved since, is started with the cases it has and cancelled with the reason: its
    conversations that have not ended end as skipped (the sweeper's next pass enqueues
    them), and the run is aggregated as any other. The guard on `pending` makes exactly
    one sweeper close it.
    """
    with session_scope(url) as session:
        cutoff = ago(session, stall_seconds)
        query = select(RunRow.id).where(
            RunRow.status == "pending",
            RunRow.created_at < cutoff,
            _nothing_moved_since(cutoff),
        )
        if run_id is not None:
            query = query.where(RunRow.id == run_id)
        abandoned = list(session.scalars(query))
    closed: list[ClosedRun] = []
    for candidate in abandoned:
        with session_scope(url) as session:
            stored = session.scalar(
                select(func.count()).select_from(CaseRow).where(CaseRow.run_id == candidate)
            )
            count = int(stored or 0)
            moved_now = session.execute(
                update(RunRow)
                .where(RunRow.id == candidate, RunRow.status == "pending")
                .values(
                    status="running",
                    total_cases=count,
                    started_at=func.coalesce(RunRow.started_at, RunRow.created_at),
                    cancelled=True,
                    cancel_reason=ABANDONED_REASON.format(stored=count),
                )
            )
            if moved_now.rowcount:  # type: ignore[attr-defined]
                closed.append(ClosedRun(candidate, count))
    return closed


def claim_stalled(
    url: str, stall_seconds: float, run_id: str | None = None, limit: int = 1000
) -> list[tuple[str, str, int]]:
    """(run, case, next_turn) of conversations whose message was presumably lost; claimed.

    A run is stalled when none of its conversations has moved (no turn started, none
    saved) for `stall_seconds` while some are still pending or ready: their messages are
    gone (a broker restart without persistence, a publish that failed for good).
    Judging the run rather than each conversation keeps a long but moving queue from
    being mistaken for a loss and flooded with copies. Each returned conversation has
    been claimed by touching its `updated_at` with a guarded UPDATE, so among several
    sweepers exactly one re-enqueues it, and nobody again for another `stall_seconds`.
    """
    with session_scope(url) as session:
        stalled = _stalled_runs(session, stall_seconds, run_id).subquery()
        candidates = session.execute(
            select(CaseRow.run_id, CaseRow.case_id, CaseRow.next_turn)
            .join(stalled, stalled.c.run_id == CaseRow.run_id)
            .join(RunRow, RunRow.id == CaseRow.run_id)
            .where(
                CaseRow.phase.in_(("pending", "ready")),
                # A run capped by --parallel: only the conversations it started.
                or_(RunRow.parallel.is_(None), CaseRow.seq < RunRow.started_cases),
            )
            .order_by(CaseRow.run_id, CaseRow.seq)
            .limit(limit)
        ).all()
    claimed: list[tuple[str, str, int]] = []
    for run, case_id, next_turn in candidates:
        with session_scope(url) as session:
            touched = session.execute(
                update(CaseRow)
                .where(
                    CaseRow.run_id == run,
                    CaseRow.case_id == case_id,
                    CaseRow.next_turn == next_turn,
                    CaseRow.phase.in_(("pending", "ready")),
                    CaseRow.updated_at < ago(session, stall_seconds),
                )
                .values(updated_at=func.now())
            )
            if touched.rowcount:  # type: ignore[attr-defined]
                claimed.append((run, case_id, next_turn))
    return claimed


def claim_stalled_starts(
    url: str, stall_seconds: float, run_id: str | None = None
) -> list[tuple[str, int, int]]:
    """(run, first, last): conversations of stalled runs capped by --parallel to start.

    The step that ends a conversation claims the next in the same statement, so a capped
    run has free slots only when it was stopped while none of its conversations was
    under way (cancelled from outside): the rest, claimed here, end skipped.
    """
    with session_scope(url) as session:
        stalled = _stalled_runs(session, stall_seconds, run_id).subquery()
        capped = list(
            session.scalars(
                select(RunRow.id)
                .join(stalled, stalled.c.run_id == RunRow.id)
                .where(RunRow.parallel.is_not(None), RunRow.started_cases < RunRow.total_cases)
            )
        )
    found: list[tuple[str, int, int]] = []
    for run in capped:
        starts = runs.claim_starts(url, run)
        if starts is not None:
            found.append((run, *starts))
    return found


def unaggregated_runs(url: str, stall_seconds: float, run_id: str | None = None) -> list[str]:
    """Runs whose conversations all ended but whose aggregation never happened.

    Either still `running` with every conversation finished and nothing moved for
    `stall_seconds` (the aggregation message was lost), or `aggregating` for longer than
    that (the aggregator died). `results.claim_aggregation` decides who does it, once.
    """
    with session_scope(url) as session:
        cutoff = ago(session, stall_seconds)
        query = select(RunRow.id).where(
            RunRow.finished_cases >= RunRow.total_cases,
            or_(
                and_(RunRow.status == "running", _nothing_moved_since(cutoff)),
                and_(RunRow.status == "aggregating", RunRow.finished_at < cutoff),
            ),
        )
        if run_id is not None:
            query = query.where(RunRow.id == run_id)
        return list(session.scalars(query))


@reconnecting
def pending_case_ids(url: str, run_id: str, first: int, last: int) -> list[str]:
    """Ids of the run's conversations numbered first..last that have not started."""
    with session_scope(url) as session:
        return list(
            session.scalars(
                select(CaseRow.case_id)
                .where(
                    CaseRow.run_id == run_id,
                    CaseRow.seq >= first,
                    CaseRow.seq <= last,
                    CaseRow.phase == "pending",
                )
                .order_by(CaseRow.seq)
            )
        )


def mark_alive(url: str, turns: list[tuple[str, str, int]]) -> None:
    """Touch the conversations whose turn (run, case, turn) is waiting, so that they count
    as moving (fleet/liveness.py): only while still at that turn and running."""
    if not turns:
        return
    with session_scope(url) as session:
        session.execute(
            update(CaseRow)
            .where(
                or_(
                    *(
                        and_(
                            CaseRow.run_id == run,
                            CaseRow.case_id == case_id,
                            CaseRow.next_turn == turn,
                        )
                        for run, case_id, turn in turns
                    )
                ),
                CaseRow.phase.in_(("pending", "ready")),
            )
            .values(updated_at=func.now())
        )


def last_moved(url: str, run_id: str) -> datetime | None:
    """When a conversation of the run was last stored or moved (None: it has none)."""
    with session_scope(url) as session:
        latest = session.scalar(
            select(func.max(CaseRow.updated_at)).where(CaseRow.run_id == run_id)
        )
    if latest is not None and latest.tzinfo is None:
        latest = latest.replace(tzinfo=UTC)  # SQLite's, written in UTC
    return latest


def moved_within(url: str, run_id: str, seconds: float) -> bool:
    """Whether any conversation of the run was stored or moved (a turn started, saved, or
    marked alive while it waits) in the last `seconds`: the rule of `claim_stalled`."""
    with session_scope(url) as session:
        latest = session.scalar(
            select(func.max(CaseRow.updated_at) >= ago(session, seconds)).where(
                CaseRow.run_id == run_id
            )
        )
    return bool(latest)
