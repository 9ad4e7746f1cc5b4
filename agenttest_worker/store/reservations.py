"""Budget reservations: a turn of a budgeted run reserves its usage before it calls.

Counting usage only when a turn is saved let every turn already running see the
budget unspent: a fleet of 2×4 threads ran 8 turns of 15 tokens against a budget of 40.
So a turn first reserves an estimate on its run (atomically across workers: under the
run row's lock on a fleet, store/sql/budget_reservations.py; on the one event loop embedded,
`MemoryReservations`), and only while spent plus reserved is below the budget. The
saved step releases its reservation and adds what it really used, in the same write.
The run then overshoots by at most the turns already in flight when it ran out (and by
what they use beyond the estimate).

The estimate is the run's average usage per turn so far. Before any turn's usage is
known, one turn runs alone (reserving the whole budget) and the others wait for it
(`wait`), rather than guessing and letting a whole fleet's first wave through.

Each conversation holds at most one reservation, kept with it: a turn run again after
its worker died replaces the dead attempt's instead of adding to it, and whatever saves
the conversation next (the turn, or its end for too many deliveries) releases it. A
turn waiting for the first usage waits at most `FIRST_TURN_WAIT` seconds; then the
first turn's reservation counts as expired (its worker may have died).

No SQLAlchemy here: the embedded store imports this before the store is set up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["reserved", "wait", "spent"]

# How long a turn waits for the first turn's usage before it stops trusting that
# reservation (its worker may be dead; its redelivery may take the visibility timeout).
FIRST_TURN_WAIT = 30.0
# Below this, a float reservation left over from subtracting is nothing.
_NOTHING = 1e-12


@dataclass(frozen=True)
class Reservation:
    """What a turn's reservation found: `tokens`/`cost` used so far, and what the other
    turns running held (`held_tokens`, `held_cost`) besides this one's own."""

    outcome: Outcome
    tokens: int = 0
    cost: float = 0.0
    held_tokens: int = 0
    held_cost: float = 0.0
    # What this turn reserved (reserved only).
    estimate_tokens: int = 0
    estimate_cost: float = 0.0


def decide(
    max_tokens: int | None,
    max_cost: float | None,
    tokens: int,
    cost: float,
    held_tokens: int,
    held_cost: float,
    turns: int,
) -> Reservation:
    """Whether a turn may start, given the run's usage, what other turns hold, and how
    many turns the usage is of (`turns`, for the average)."""
    if (max_tokens is not None and tokens >= max_tokens) or (
        max_cost is not None and cost >= max_cost
    ):
        return Reservation("spent", tokens, cost, held_tokens, held_cost)
    if not turns and (held_tokens > 0 or held_cost > _NOTHING):
        return Reservation("wait", tokens, cost, held_tokens, held_cost)
    if (max_tokens is not None and tokens + held_tokens >= max_tokens) or (
        max_cost is not None and cost + held_cost >= max_cost
    ):
        return Reservation("spent", tokens, cost, held_tokens, held_cost)
    estimate_tokens = 0 if max_tokens is None else -(-tokens // turns) if turns else max_tokens
    estimate_cost = 0.0 if max_cost is None else cost / turns if turns else max_cost
    return Reservation(
        "reserved",
        tokens,
        cost,
        held_tokens,
        held_cost,
        estimate_tokens=estimate_tokens,
        estimate_cost=estimate_cost,
    )


@dataclass(frozen=True)
class TurnReservation:
    """A budgeted run's next turn of one conversation, asking to reserve its usage
    (`ConversationStore.reserve_turn`)."""

    run_id: str
    case_id: str
    max_tokens: int | None
    max_cost: float | None
    # The other turns' reservations count as gone (the wait for the first turn's usage
    # ran out: its worker may have died).
    expired: bool = False


class MemoryReservations:
    """The embedded store's reservations (BufferedStore): in memory, and atomic because
    every conversation of the run steps on one event loop. (A mixin: the store's `run`
    holds the totals.)"""

    def _ledger(self) -> dict[str, tuple[int, float]]:
        # Made on first use, so that a store without a budget never holds one.
        ledger: dict[str, tuple[int, float]] = self.__dict__.setdefault("_reserved", {})
        return ledger

    def reserve_turn(self, turn: TurnReservation) -> Reservation:
        ledger = self._ledger()
        ledger.pop(turn.case_id, None)  # this conversation's earlier attempt's, if any
        held = (0, 0.0) if turn.expired else _sum(ledger.values())
        run = self.__dict__["run"]
        found = decide(
            turn.max_tokens,
            turn.max_cost,
            run.total_tokens,
            run.total_cost,
            *held,
            self.__dict__.get("_budget_turns", 0),
        )
        if found.outcome == "reserved":
            ledger[turn.case_id] = (found.estimate_tokens, found.estimate_cost)
        return found

    def release_reservation(self, case_id: str, turns: int) -> None:
        """The conversation's step is saved: its usage replaces its reservation."""
        if "_reserved" in self.__dict__:
            self._ledger().pop(case_id, None)
            self.__dict__["_budget_turns"] = self.__dict__.get("_budget_turns", 0) + turns


def _sum(held: Iterable[tuple[int, float]]) -> tuple[int, float]:
    tokens, cost = 0, 0.0
    for t, c in held:
        tokens += t
        cost += c
    return tokens, cost
