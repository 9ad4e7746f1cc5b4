"""What a conversation step needs from storage, and the store that goes to the database.

`ConversationStore` is all the driver (driver/step.py) knows of a store. `SqlStore`
goes to the database on every step: what workers use, so that any worker can take any
turn and nothing is lost when one dies. The embedded runner's `BufferedStore`
(buffered.py) keeps its run in memory and writes it in batches. A test that needs a
store to fail passes in one that does (a faulty engine in a SqlStore, or a wrapper).

Nothing here imports SQLAlchemy until a SqlStore is made: the driver and the embedded
runner import this module before the store is needed (see buffered.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from agenttest_worker.results import RoleUsage, UsageRole
from agenttest_worker.store.kept_states import KEPT
from agenttest_worker.store.reservations import Reservation, TurnReservation
from agenttest_worker.store.steps import LoadedCase, Saved, Step

log = logging.getLogger("agenttest.store")

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


class ConversationStore(Protocol):
    """The five things a step needs from storage.

    A store may also say `keeps_turn_records = True`: it stores a step's
    `Step.archive` and hands a conversation's turn records back with its state
    (`LoadedCase.turn_records`), so that the driver saves states without the turns
    that left them (driver/state_cache.py). Without it, states are saved whole.
    """

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> LoadedCase | None:
        """The conversation and what its run says, or None when it is not stored.

        `count_delivery` counts this delivery of the turn (a redelivered message); with
        `turn`, only a delivery of the turn the conversation is waiting for counts.
        """
        ...

    def save_step(self, step: Step) -> Saved:
        """Record `step` once, if the conversation is still where it ran (steps.Step)."""
        ...

    def reserve_turn(self, turn: TurnReservation) -> Reservation:
        """Reserve the usage of a budgeted run's next turn of one conversation, or say
        why not (reservations.py)."""
        ...

    def cancel_run(self, run_id: str, reason: str) -> bool:
        """Cancel the run (its conversations not yet ended end as skipped); whether this
        call did it."""
        ...

    def add_unrecorded_usage(self, run_id: str, usage: Mapping[UsageRole, RoleUsage]) -> None:
        """Count the calls of a step that was played but not saved (a copy of its
        message saved it first, or its conversation was ended meanwhile) in the run's
        usage and its totals (what --max-tokens and --max-cost count): they were made,
        and paid for, all the same."""
        ...


class SqlStore:
    """Every step straight to the database (workers, and anything shared).

    `engine` stands in for the URL's own (`db.get_engine`): a test passes one that fails
    the way it needs. A conversation whose state this process kept when it saved the
    last step is loaded without its state (kept_states.py).
    """

    keeps_turn_records = True

    def __init__(self, url: str, engine: Engine | None = None) -> None:
        # Imported here, not above: a dry run, or the engine's users, never need
        # SQLAlchemy.
        from agenttest_worker.store.sql import budget_reservations as budget
        from agenttest_worker.store.sql import runs, turns
        from agenttest_worker.store.sql.db import get_engine

        self.url = url
        self._engine = engine
        self._get_engine = get_engine
        self._runs = runs
        self._turns = turns
        self._budget = budget

    @property
    def engine(self) -> Engine:
        return self._engine if self._engine is not None else self._get_engine(self.url)

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> LoadedCase | None:
        known = KEPT.token(run_id, case_id)
        return self._turns.load_case(self.engine, run_id, case_id, count_delivery, turn, known)

    def save_step(self, step: Step) -> Saved:
        return self._turns.save_step(self.engine, step)

    def reserve_turn(self, turn: TurnReservation) -> Reservation:
        return self._budget.reserve_turn(self.engine, turn)

    def cancel_run(self, run_id: str, reason: str) -> bool:
        return self._runs.cancel_run(self.url, run_id, reason)

    def add_unrecorded_usage(self, run_id: str, usage: Mapping[UsageRole, RoleUsage]) -> None:
        # SQLAlchemy: see __init__.
        from agenttest_worker.store.sql.db import error_reason
        from agenttest_worker.store.sql.usage import add_run_usage

        try:
            add_run_usage(self.url, run_id, usage, spent=True, unsaved=True)
        except Exception as exc:
            # The step itself is recorded (by the other copy): failing the task now
            # would report a failure where only the count of its extra calls is lost.
            log.warning(
                "could not count the calls of a turn of run %s played but not recorded: %s",
                run_id,
                error_reason(exc),
            )
