"""What the embedded store keeps in memory: the run's row (`BufferedRun`) and each
conversation under way (`HeldConversation`). No SQLAlchemy: see buffered.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.store import steps
from agenttest_worker.store.memory.flush_batch import CaseValues, StepRecord


@dataclass
class BufferedRun:
    """The run row: what its conversations' steps move (counters, spend, a cancel)."""

    options: dict[str, Any]
    config: dict[str, Any]
    cancelled: bool
    cancel_reason: str | None
    deadline_at: float | None
    status: str
    total_cases: int
    finished_cases: int
    total_tokens: int
    total_cost: float
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class HeldConversation:
    """A conversation as the embedded store holds it while it is played."""

    case: dict[str, Any]
    agent: str | None
    phase: str
    next_turn: int
    # As the step handed it over (often text): read back by the next step, and turned
    # into objects only for the database, once per flush.
    state: steps.JsonDocument | None
    deliveries: int
    result: StepRecord | None = None

    def values(self) -> CaseValues:
        return CaseValues(self.next_turn, self.phase, self.state, self.result)


def read_run(url: str, run_id: str) -> tuple[BufferedRun, dict[str, HeldConversation]]:
    """A stored run and its conversations as they are now (a run being resumed)."""
    # The store's SQLAlchemy modules only once it is used: see buffered.py.
    from sqlalchemy import select

    from agenttest_worker.store.sql.db import get_engine
    from agenttest_worker.store.sql.shared import CASES, RUNS

    with get_engine(url).connect() as connection:
        row = connection.execute(select(RUNS).where(RUNS.c.id == run_id)).one()
        run = BufferedRun(
            options=row.options,
            config=row.config,
            cancelled=row.cancelled,
            cancel_reason=row.cancel_reason,
            deadline_at=row.deadline_at,
            status=row.status,
            total_cases=row.total_cases,
            finished_cases=row.finished_cases,
            total_tokens=row.total_tokens,
            total_cost=row.total_cost,
            counters={
                "passed": row.passed,
                "failed": row.failed,
                "skipped": row.skipped,
                "total_turns": row.total_turns,
            },
        )
        conversations = {
            c.case_id: HeldConversation(
                c.case, c.agent, c.phase, c.next_turn, c.state, c.deliveries
            )
            for c in connection.execute(
                select(
                    CASES.c.case_id,
                    CASES.c.case,
                    CASES.c.agent,
                    CASES.c.phase,
                    CASES.c.next_turn,
                    CASES.c.state,
                    CASES.c.deliveries,
                ).where(CASES.c.run_id == run_id)
            )
        }
    return run, conversations
