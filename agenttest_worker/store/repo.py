"""Reading and writing runs, conversations and results: every query the system makes.

Writes are idempotent on (run, case, turn): `save_step` moves a conversation on only
if it is still at the turn the task ran (a guarded UPDATE), and inserts its rows with
ON CONFLICT DO NOTHING. So a redelivered task, or the same task run twice at once,
records each turn exactly once; the loser's work is discarded. A conversation that
ends bumps its run's counters in the same transaction, and the caller that sees the
last one finish enqueues the aggregator, which claims the run once.
"""

from __future__ import annotations

import getpass
import secrets
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from agenttest_worker.results import AgentCallRecord, AssertionResult, CaseResult, TurnResult
from agenttest_worker.settings import get_settings
from agenttest_worker.store.db import session_scope
from agenttest_worker.store.models import (
    AgentCallRow,
    AssertionResultRow,
    Base,
    CaseRow,
    RunReportRow,
    RunRow,
    TurnRow,
)


def new_run_id() -> str:
    """Sortable by time, unique across a fleet: 20261129-203512-3fa9c1."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def submitted_by() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _insert(session: Session, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect of the session's database."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    module: Any = postgresql if dialect == "postgresql" else sqlite
    # One statement executed for many rows (not a VALUES list per call): its compiled
    # form is cached, so a turn's inserts cost no SQL compilation.
    statement = module.insert(model.__table__).on_conflict_do_nothing()
    session.connection().execute(statement, list(rows))


def _ago(session: Session, seconds: float) -> ColumnElement[datetime]:
    """The instant `seconds` before now, by the database's clock where it has one.

    `updated_at` is written by the database (`now()`), so staleness is judged by the
    same clock: workers on hosts with skewed clocks still agree on what is stale.
    (SQLite's `now()` has whole seconds only: there, this process's clock.)
    """
    if session.get_bind().dialect.name == "postgresql":
        return func.now() - timedelta(seconds=seconds)
    return literal(datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=seconds))


def _now(session: Session) -> ColumnElement[datetime]:
    return _ago(session, 0)


# -- runs ----------------------------------------------------------------------------------


def create_run(
    url: str,
    *,
    run_id: str,
    agent: str | None,
    input_label: str,
    options: dict[str, Any],
    config: dict[str, Any],
    parent_run_id: str | None = None,
    deadline_at: float | None = None,
) -> None:
    with session_scope(url) as session:
        session.add(
            RunRow(
                id=run_id,
                # Set here rather than by the database: SQLite's CURRENT_TIMESTAMP has
                # whole seconds, and `latest_run` ("last") must tell apart two runs
                # submitted within one second (their ids then sort at random).
                created_at=datetime.now(UTC),
                status="pending",
                submitted_by=submitted_by(),
                agent=agent,
                input_label=input_label,
                options=options,
                config=config,
                parent_run_id=parent_run_id,
                deadline_at=deadline_at,
            )
        )


@dataclass(frozen=True)
class NewCase:
    seq: int
    case_id: str
    case: dict[str, Any]
    agent: str | None


def add_cases(url: str, run_id: str, cases: Iterable[NewCase]) -> int:
    rows = [
        {
            "run_id": run_id,
            "case_id": c.case_id,
            "seq": c.seq,
            "case": c.case,
            "agent": c.agent,
            "phase": "pending",
            "next_turn": 1,
            "deliveries": 0,
        }
        for c in cases
    ]
    with session_scope(url) as session:
        _insert(session, CaseRow, rows)
    return len(rows)


def start_run(url: str, run_id: str, total: int) -> None:
    with session_scope(url) as session:
        session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(status="running", total_cases=total, started_at=datetime.now(UTC))
        )


def get_run(url: str, run_id: str) -> RunRow | None:
    with session_scope(url) as session:
        return session.get(RunRow, run_id)


def latest_run(url: str) -> RunRow | None:
    with session_scope(url) as session:
        return session.scalars(
            select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id.desc()).limit(1)
        ).first()


def cancel_run(url: str, run_id: str, reason: str) -> bool:
    with session_scope(url) as session:
        result = session.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.cancelled.is_(False))
            .values(cancelled=True, cancel_reason=reason)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def delete_run(url: str, run_id: str) -> None:
    """Remove a run that never started (its cases failed to store)."""
    with session_scope(url) as session:
        session.execute(delete(TurnRow).where(TurnRow.run_id == run_id))
        session.execute(delete(AssertionResultRow).where(AssertionResultRow.run_id == run_id))
        session.execute(delete(AgentCallRow).where(AgentCallRow.run_id == run_id))
        session.execute(delete(CaseRow).where(CaseRow.run_id == run_id))
        session.execute(delete(RunRow).where(RunRow.id == run_id))


# -- conversations -------------------------------------------------------------------------


@dataclass
class LoadedCase:
    run_id: str
    case_id: str
    case: dict[str, Any]
    agent: str | None
    phase: str
    next_turn: int
    state: dict[str, Any] | None
    deliveries: int
    run_cancelled: bool
    cancel_reason: str | None
    run_options: dict[str, Any]
    run_config: dict[str, Any]
    deadline_at: float | None
    run_tokens: int = 0
    run_cost: float = 0.0


def load_case(
    url: str, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
) -> LoadedCase | None:
    """The conversation and what its run says; optionally counting this delivery.

    With `turn`, only a delivery of the turn the conversation is waiting for counts: a
    duplicate or stale message must not use up the next turn's delivery budget.
    """
    with session_scope(url) as session:
        row = session.execute(
            select(CaseRow, RunRow)
            .join(RunRow, RunRow.id == CaseRow.run_id)
            .where(CaseRow.run_id == run_id, CaseRow.case_id == case_id)
        ).first()
        if row is None:
            return None
        case_row, run_row = row
        deliveries = case_row.deliveries
        current = turn is None or (
            case_row.next_turn == turn and case_row.phase in ("pending", "ready")
        )
        if count_delivery and current:
            guard = [CaseRow.run_id == run_id, CaseRow.case_id == case_id]
            if turn is not None:
                guard.append(CaseRow.next_turn == turn)
            counted = session.execute(
                update(CaseRow)
                .where(*guard)
                .values(deliveries=CaseRow.deliveries + 1)
                .returning(CaseRow.deliveries)
            ).scalar_one_or_none()
            if counted is not None:
                deliveries = counted
        return LoadedCase(
            run_id=run_id,
            case_id=case_id,
            case=case_row.case,
            agent=case_row.agent,
            phase=case_row.phase,
            next_turn=case_row.next_turn,
            state=case_row.state,
            deliveries=deliveries,
            run_cancelled=run_row.cancelled,
            cancel_reason=run_row.cancel_reason,
            run_options=run_row.options,
            run_config=run_row.config,
            deadline_at=run_row.deadline_at,
            run_tokens=run_row.total_tokens,
            run_cost=run_row.total_cost,
        )


@dataclass(frozen=True)
class Saved:
    saved: bool
    run_finished: bool = False


def _turn_rows(run_id: str, case_id: str, turns: Iterable[TurnResult]) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "case_id": case_id,
            "turn": t.turn,
            "input": t.input,
            "input_source": t.input_source,
            "output": t.output,
            "tool_calls": [c.model_dump(mode="json", exclude_none=True) for c in t.tool_calls],
            "awaiting_input": t.awaiting_input,
            "status": t.status,
            "duration_ms": t.duration_ms,
            "error": t.error,
            "skip_reason": t.skip_reason,
        }
        for t in turns
    ]


def _assertion_rows(
    run_id: str, case_id: str, turn: int, results: Sequence[AssertionResult]
) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "case_id": case_id,
            "turn": turn,
            "position": i,
            "type": r.type,
            "passed": r.passed,
            "reason": r.reason,
            "detail": r.model_dump(mode="json"),
        }
        for i, r in enumerate(results)
    ]


def _call_rows(
    run_id: str, case_id: str, turn: int, calls: Sequence[AgentCallRecord]
) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "case_id": case_id,
            "turn": turn,
            "position": i,
            "role": c.role,
            "agent": c.agent,
            "latency_ms": c.latency_ms,
            "attempts": c.attempts,
            "status_code": c.status_code,
            "prompt_tokens": c.usage.prompt_tokens if c.usage else 0,
            "completion_tokens": c.usage.completion_tokens if c.usage else 0,
            "total_tokens": c.usage.total_tokens if c.usage else 0,
            "error": c.error,
        }
        for i, c in enumerate(calls)
    ]


def save_step(
    url: str,
    *,
    run_id: str,
    case_id: str,
    expected_turn: int,
    next_turn: int,
    phase: str,
    state: dict[str, Any],
    new_turns: Sequence[TurnResult],
    final_assertions: Sequence[AssertionResult] = (),
    result: CaseResult | None = None,
    expected_phase: str | None = None,
    spend: tuple[int, float] | None = None,
) -> Saved:
    """Record one step of a conversation, exactly once (see the module docstring).

    `spend` (tokens, cost) is added to the run's totals with the step: runs with a
    budget account per turn, so the next turn anywhere in the fleet sees it. Without,
    tokens are added once per case when it ends (one write to the run row per case).
    """
    with session_scope(url) as session:
        guard = [
            CaseRow.run_id == run_id,
            CaseRow.case_id == case_id,
            CaseRow.next_turn == expected_turn,
        ]
        if expected_phase is not None:
            guard.append(CaseRow.phase == expected_phase)
        else:
            guard.append(CaseRow.phase.in_(("pending", "ready")))
        moved = session.execute(
            update(CaseRow)
            .where(*guard)
            .values(
                next_turn=next_turn,
                phase=phase,
                state=state,
                status=result.status if result else None,
                result=result.model_dump(mode="json") if result else None,
                deliveries=0,
            )
        )
        if not moved.rowcount:  # type: ignore[attr-defined]
            return Saved(False)
        _insert(session, TurnRow, _turn_rows(run_id, case_id, new_turns))
        for turn in new_turns:
            _insert(
                session,
                AssertionResultRow,
                _assertion_rows(run_id, case_id, turn.turn, turn.assertions),
            )
            _insert(session, AgentCallRow, _call_rows(run_id, case_id, turn.turn, turn.calls or []))
        _insert(session, AssertionResultRow, _assertion_rows(run_id, case_id, 0, final_assertions))
        counters: dict[str, Any] = {}
        if spend is not None and (spend[0] or spend[1]):
            counters["total_tokens"] = RunRow.total_tokens + spend[0]
            counters["total_cost"] = RunRow.total_cost + spend[1]
        if result is None:
            if counters:
                session.execute(update(RunRow).where(RunRow.id == run_id).values(**counters))
            return Saved(True)
        counters.update(
            {
                "finished_cases": RunRow.finished_cases + 1,
                "total_turns": RunRow.total_turns + result.total_turns,
                result.status: getattr(RunRow, result.status) + 1,
            }
        )
        if spend is None:
            counters["total_tokens"] = RunRow.total_tokens + (
                result.usage.total_tokens if result.usage else 0
            )
        row = session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(**counters)
            .returning(RunRow.finished_cases, RunRow.total_cases, RunRow.status)
        ).one()
        finished, total, status = row
        return Saved(True, run_finished=status == "running" and finished >= total)


# -- aggregation and reading results ------------------------------------------------------------


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
                        RunRow.finished_at < _ago(session, lease),
                    ),
                ),
            )
            .values(status="aggregating", finished_at=_now(session))
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def complete_run(url: str, run_id: str, reports: dict[str, str]) -> None:
    with session_scope(url) as session:
        _insert(
            session,
            RunReportRow,
            [{"run_id": run_id, "format": fmt, "content": text} for fmt, text in reports.items()],
        )
        session.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(status="done", finished_at=datetime.now(UTC))
        )


def get_report(url: str, run_id: str, fmt: str) -> str | None:
    with session_scope(url) as session:
        row = session.get(RunReportRow, (run_id, fmt))
        return row.content if row else None


def iter_results(url: str, run_id: str, batch: int = 500) -> Iterator[CaseResult]:
    """The run's case records in submission order, read in batches."""
    last = -1
    while True:
        with session_scope(url) as session:
            rows = session.execute(
                select(CaseRow.seq, CaseRow.result)
                .where(CaseRow.run_id == run_id, CaseRow.seq > last, CaseRow.result.is_not(None))
                .order_by(CaseRow.seq)
                .limit(batch)
            ).all()
        if not rows:
            return
        for seq, result in rows:
            last = seq
            yield CaseResult.model_validate(result)


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


# -- recovering from lost messages --------------------------------------------------------------


def _stalled_runs(session: Session, stall_seconds: float, run_id: str | None) -> Any:
    """Running runs none of whose conversations moved (turn started or saved) lately."""
    query = (
        select(CaseRow.run_id)
        .join(RunRow, RunRow.id == CaseRow.run_id)
        .where(RunRow.status == "running")
        .group_by(CaseRow.run_id)
        .having(func.max(CaseRow.updated_at) < _ago(session, stall_seconds))
    )
    if run_id is not None:
        query = query.where(CaseRow.run_id == run_id)
    return query


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
            .where(CaseRow.phase.in_(("pending", "ready")))
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
                    CaseRow.updated_at < _ago(session, stall_seconds),
                )
                .values(updated_at=func.now())
            )
            if touched.rowcount:  # type: ignore[attr-defined]
                claimed.append((run, case_id, next_turn))
    return claimed


def unaggregated_runs(url: str, stall_seconds: float, run_id: str | None = None) -> list[str]:
    """Runs whose conversations all ended but whose aggregation never happened.

    Either still `running` with every conversation finished and nothing moved for
    `stall_seconds` (the aggregation message was lost), or `aggregating` for longer than
    that (the aggregator died). `claim_aggregation` decides who does it, once.
    """
    with session_scope(url) as session:
        cutoff = _ago(session, stall_seconds)
        moved = (
            select(func.max(CaseRow.updated_at))
            .where(CaseRow.run_id == RunRow.id)
            .scalar_subquery()
        )
        query = select(RunRow.id).where(
            RunRow.finished_cases >= RunRow.total_cases,
            or_(
                and_(RunRow.status == "running", or_(moved.is_(None), moved < cutoff)),
                and_(RunRow.status == "aggregating", RunRow.finished_at < cutoff),
            ),
        )
        if run_id is not None:
            query = query.where(RunRow.id == run_id)
        return list(session.scalars(query))


def store_report(url: str, run_id: str, fmt: str, content: str) -> None:
    """Keep one more report with the run (e.g. a reporter agent's), replacing an older one."""
    with session_scope(url) as session:
        session.execute(
            delete(RunReportRow).where(RunReportRow.run_id == run_id, RunReportRow.format == fmt)
        )
        session.add(RunReportRow(run_id=run_id, format=fmt, content=content))


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
