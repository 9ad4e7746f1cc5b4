"""A fleet step played on a worker's event loop (fleet/loop_pool.py): the same step as
`step.run_step_sync`, with the agent calls awaited on the loop beside every other turn
in flight and the store's blocking calls handed to a few threads (`Offload`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agenttest_worker.driver import budget
from agenttest_worker.driver.step import (
    Advance,
    PoolCache,
    Prepared,
    _after_commit,
    _stopped,
    commit_or_fail,
    end_without_running,
    play_on_fleet,
    prepare,
)
from agenttest_worker.engine import ConversationState
from agenttest_worker.store.base import ConversationStore

T = TypeVar("T")


class Offload(Protocol):
    """Runs a blocking call off the event loop (a thread of a small pool)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


async def run_step_offloaded(
    store: ConversationStore,
    pools: PoolCache,
    turn: TurnAddress,
    offload: Offload,
    then: Callable[[Advance], None] | None = None,
) -> Advance:
    """One step of a fleet turn played on the worker's event loop (fleet/loop_pool.py).

    The agent calls run on the loop, beside every other turn in flight; the store's
    calls are blocking and go through `offload` (a few threads), so that a database
    round trip never stops the loop. `then(advance)` runs on the same thread right
    after the save (the fleet publishes what comes next there: one hand-off, not two).
    In all else the same step as `run_step_sync`."""
    prepared = await offload(
        prepare,
        store,
        turn.run_id,
        turn.case_id,
        turn.turn,
        turn.max_deliveries,
        turn.redelivered,
    )
    if isinstance(prepared, Advance):
        if then is not None:
            await offload(then, prepared)
        return prepared
    state = _stopped(prepared, turn.max_deliveries)
    if state is None and (
        spent := await budget.reserve_offloaded(store, prepared.loaded, prepared.options, offload)
    ):
        state = end_without_running(prepared, "skip", spent)
    if state is None:
        state = await play_on_fleet(pools, prepared)
    return await offload(_save, store, prepared, state, then)


def _save(
    store: ConversationStore,
    prepared: Prepared,
    state: ConversationState,
    then: Callable[[Advance], None] | None,
) -> Advance:
    """Save the step and hand what comes next to `then`, on a store thread."""
    advance = _after_commit(store, prepared, commit_or_fail(store, prepared, state))
    if then is not None:
        then(advance)
    return advance


@dataclass(frozen=True)
class TurnAddress:
    """Which turn a fleet step plays, and how it was delivered."""

    run_id: str
    case_id: str
    turn: int
    max_deliveries: int | None
    redelivered: bool = False
