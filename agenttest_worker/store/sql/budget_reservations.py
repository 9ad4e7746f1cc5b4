"""Budget reservations in the database (a fleet): see reservations.py for the design.

A reservation locks the conversation's row, then its run's (the order a step's save
takes them in, so the two never deadlock), decides under those locks, and moves the
run's `reserved_*` by the difference between this turn's estimate and what the
conversation held before (a dead attempt's, replaced). `release` runs inside the save's
transaction, after its guarded UPDATE moved the conversation on.

Only runs with a budget come here: the steps of a run without one never touch these
columns (turns.save_step keeps its one-statement save for them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection, Engine

from agenttest_worker.store.reservations import Reservation, TurnReservation, decide
from agenttest_worker.store.sql.db import reconnecting
from agenttest_worker.store.sql.shared import CASES, RUNS

_CASE = [CASES.c.run_id == bindparam("b_run"), CASES.c.case_id == bindparam("b_case")]
_HELD = select(CASES.c.reserved_tokens, CASES.c.reserved_cost).where(*_CASE).with_for_update()
_RUN = (
    select(
        RUNS.c.total_tokens,
        RUNS.c.total_cost,
        RUNS.c.reserved_tokens,
        RUNS.c.reserved_cost,
        RUNS.c.budget_turns,
    )
    .where(RUNS.c.id == bindparam("b_run"))
    .with_for_update()
)
_HOLD = (
    update(CASES)
    .where(*_CASE)
    .values(reserved_tokens=bindparam("b_tokens"), reserved_cost=bindparam("b_cost"))
)
_MOVE = (
    update(RUNS)
    .where(RUNS.c.id == bindparam("b_run"))
    .values(
        reserved_tokens=RUNS.c.reserved_tokens + bindparam("b_tokens"),
        reserved_cost=RUNS.c.reserved_cost + bindparam("b_cost"),
        budget_turns=RUNS.c.budget_turns + bindparam("b_turns"),
    )
)


@reconnecting
def reserve_turn(engine: Engine, turn: TurnReservation) -> Reservation:
    """Reserve the next turn's estimate, or say why not (reservations.decide)."""
    keys: dict[str, Any] = {"b_run": turn.run_id, "b_case": turn.case_id}
    with engine.begin() as connection:
        own = connection.execute(_HELD, keys).one_or_none()
        if own is None:
            return Reservation("reserved")  # the run was removed: the save finds it gone
        run = connection.execute(_RUN, keys).one()
        held_tokens = 0 if turn.expired else run.reserved_tokens - own.reserved_tokens
        held_cost = 0.0 if turn.expired else run.reserved_cost - own.reserved_cost
        found = decide(
            turn.max_tokens,
            turn.max_cost,
            run.total_tokens,
            run.total_cost,
            held_tokens,
            held_cost,
            run.budget_turns,
        )
        tokens, cost = found.estimate_tokens, found.estimate_cost
        if (tokens, cost) != (own.reserved_tokens, own.reserved_cost):
            _hold(connection, keys, own, tokens, cost, 0)
        return found


def release(connection: Connection, run_id: str, case_id: str, turns: int) -> None:
    """In a step's save: the conversation's reservation ends, `turns` join the average."""
    keys: dict[str, Any] = {"b_run": run_id, "b_case": case_id}
    own = connection.execute(_HELD, keys).one_or_none()
    if own is not None and (own.reserved_tokens or own.reserved_cost or turns):
        _hold(connection, keys, own, 0, 0.0, turns)


def _hold(
    connection: Connection, keys: dict[str, Any], own: Any, tokens: int, cost: float, turns: int
) -> None:
    connection.execute(_HOLD, {**keys, "b_tokens": tokens, "b_cost": cost})
    moved = {
        "b_tokens": tokens - own.reserved_tokens,
        "b_cost": cost - own.reserved_cost,
        "b_turns": turns,
    }
    connection.execute(_MOVE, {**keys, **moved})
