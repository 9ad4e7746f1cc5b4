"""Where a conversation's steps are loaded from and saved to.

`SqlStore` goes to the database on every step: what workers use, so that any worker
can take any turn and nothing is lost when one dies. `BufferedStore` is the embedded
runner's: one process owns the whole run, so conversations are kept in memory, with
the same guards (a step is saved once, at the turn it ran), and what they produce is
written to the same tables in batches. A run interrupted mid-way loses at most the
last half second of turns, which `agenttest-submit resume` runs again.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Table, bindparam, select, update

from agenttest_worker.results import AssertionResult, CaseResult, TurnResult
from agenttest_worker.store import repo
from agenttest_worker.store.db import get_engine
from agenttest_worker.store.models import (
    AgentCallRow,
    AssertionResultRow,
    CaseRow,
    RunRow,
    TurnRow,
)


class ConversationStore(Protocol):
    """The three things a step needs from storage."""

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> repo.LoadedCase | None: ...

    def save_step(
        self,
        *,
        run_id: str,
        case_id: str,
        expected_turn: int,
        next_turn: int,
        phase: str,
        state: dict[str, Any],
        new_turns: list[TurnResult],
        final_assertions: list[AssertionResult] | tuple[()] = (),
        result: CaseResult | None = None,
        expected_phase: str | None = None,
        spend: tuple[int, float] | None = None,
    ) -> repo.Saved: ...

    def cancel_run(self, run_id: str, reason: str) -> bool: ...


class SqlStore:
    """Every step straight to the database (workers, and anything shared)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> repo.LoadedCase | None:
        return repo.load_case(self.url, run_id, case_id, count_delivery, turn)

    def save_step(self, **step: Any) -> repo.Saved:
        return repo.save_step(self.url, **step)

    def cancel_run(self, run_id: str, reason: str) -> bool:
        return repo.cancel_run(self.url, run_id, reason)


def as_store(store: ConversationStore | str) -> ConversationStore:
    return SqlStore(store) if isinstance(store, str) else store


# -- the embedded runner's store ------------------------------------------------------------


@dataclass
class _Conversation:
    case: dict[str, Any]
    agent: str | None
    phase: str
    next_turn: int
    state: dict[str, Any] | None
    deliveries: int
    result: dict[str, Any] | None = None


@dataclass
class _Run:
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


_cases: Table = CaseRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]

_FLUSH_CASE = (
    update(_cases)
    .where(_cases.c.run_id == bindparam("b_run"), _cases.c.case_id == bindparam("b_case"))
    .values(
        next_turn=bindparam("b_next"),
        phase=bindparam("b_phase"),
        state=bindparam("b_state", type_=repo.JSON_OR_NULL),
        status=bindparam("b_status"),
        result=bindparam("b_result", type_=repo.JSON_OR_NULL),
        deliveries=0,
    )
)


class BufferedStore:
    """One run's conversations in memory, written to the database in batches."""

    def __init__(self, url: str, run_id: str, flush_every: float = 0.5) -> None:
        self.url = url
        self.run_id = run_id
        self.flush_every = flush_every
        self._last_flush = time.monotonic()
        self._dirty: dict[str, _Conversation] = {}
        self._rows: dict[type, list[dict[str, Any]]] = {
            TurnRow: [],
            AssertionResultRow: [],
            AgentCallRow: [],
        }
        self._cancel: str | None = None
        with get_engine(url).connect() as connection:
            run = connection.execute(select(_runs).where(_runs.c.id == run_id)).one()
            self.run = _Run(
                options=run.options,
                config=run.config,
                cancelled=run.cancelled,
                cancel_reason=run.cancel_reason,
                deadline_at=run.deadline_at,
                status=run.status,
                total_cases=run.total_cases,
                finished_cases=run.finished_cases,
                total_tokens=run.total_tokens,
                total_cost=run.total_cost,
                counters={
                    "passed": run.passed,
                    "failed": run.failed,
                    "skipped": run.skipped,
                    "total_turns": run.total_turns,
                },
            )
            self.conversations = {
                row.case_id: _Conversation(
                    row.case, row.agent, row.phase, row.next_turn, row.state, row.deliveries
                )
                for row in connection.execute(
                    select(
                        _cases.c.case_id,
                        _cases.c.case,
                        _cases.c.agent,
                        _cases.c.phase,
                        _cases.c.next_turn,
                        _cases.c.state,
                        _cases.c.deliveries,
                    ).where(_cases.c.run_id == run_id)
                )
            }

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> repo.LoadedCase | None:
        found = self.conversations.get(case_id) if run_id == self.run_id else None
        if found is None:
            return None
        run = self.run
        return repo.LoadedCase(
            run_id=run_id,
            case_id=case_id,
            case=found.case,
            agent=found.agent,
            phase=found.phase,
            next_turn=found.next_turn,
            # The step validates this into its own objects; it never changes ours.
            state=found.state,
            deliveries=found.deliveries,
            run_cancelled=run.cancelled,
            cancel_reason=run.cancel_reason,
            run_options=run.options,
            run_config=run.config,
            deadline_at=run.deadline_at,
            run_tokens=run.total_tokens,
            run_cost=run.total_cost,
        )

    def save_step(
        self,
        *,
        run_id: str,
        case_id: str,
        expected_turn: int,
        next_turn: int,
        phase: str,
        state: dict[str, Any],
        new_turns: list[TurnResult],
        final_assertions: list[AssertionResult] | tuple[()] = (),
        result: CaseResult | None = None,
        expected_phase: str | None = None,
        spend: tuple[int, float] | None = None,
    ) -> repo.Saved:
        found = self.conversations.get(case_id) if run_id == self.run_id else None
        if found is None or found.next_turn != expected_turn:
            return repo.Saved(False)
        allowed = ("pending", "ready") if expected_phase is None else (expected_phase,)
        if found.phase not in allowed:
            return repo.Saved(False)
        found.next_turn, found.phase, found.state = next_turn, phase, state
        found.deliveries = 0
        self._dirty[case_id] = found
        added = repo.step_rows(run_id, case_id, new_turns, final_assertions)
        self._rows[TurnRow] += added.turns
        self._rows[AssertionResultRow] += added.verdicts
        self._rows[AgentCallRow] += added.calls
        tokens, cost = repo.step_spend(spend, result)
        run = self.run
        run.total_cost += cost
        run.total_tokens += tokens
        if result is None:
            return repo.Saved(True)
        found.result = result.model_dump(mode="json")
        run.finished_cases += 1
        run.counters[result.status] += 1
        run.counters["total_turns"] += result.total_turns
        finished = run.status == "running" and run.finished_cases >= run.total_cases
        return repo.Saved(True, run_finished=finished)

    def cancel_run(self, run_id: str, reason: str) -> bool:
        if run_id != self.run_id or self.run.cancelled:
            return False
        self.run.cancelled, self.run.cancel_reason = True, reason
        self._cancel = reason
        return True

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write everything saved since the last flush, in one transaction."""
        self._last_flush = time.monotonic()
        dirty, self._dirty = self._dirty, {}
        rows, self._rows = self._rows, {TurnRow: [], AssertionResultRow: [], AgentCallRow: []}
        cancel, self._cancel = self._cancel, None
        if not dirty and not any(rows.values()) and cancel is None:
            return
        run = self.run
        with get_engine(self.url).begin() as connection:
            if dirty:
                connection.execute(
                    _FLUSH_CASE,
                    [
                        {
                            "b_run": self.run_id,
                            "b_case": case_id,
                            "b_next": c.next_turn,
                            "b_phase": c.phase,
                            "b_state": c.state,
                            "b_status": (c.result or {}).get("status"),
                            "b_result": c.result,
                        }
                        for case_id, c in dirty.items()
                    ],
                )
            for model, batch in rows.items():
                repo.insert_rows(connection, model, batch)
            values: dict[str, Any] = {
                "finished_cases": run.finished_cases,
                "total_tokens": run.total_tokens,
                "total_cost": run.total_cost,
                **run.counters,
            }
            if cancel is not None:
                values.update(cancelled=True, cancel_reason=cancel)
            connection.execute(update(_runs).where(_runs.c.id == self.run_id).values(**values))

    def snapshot(self) -> dict[str, _Conversation]:
        """A copy of the conversations (for tests and the deadline sweep)."""
        return copy.deepcopy(self.conversations)
