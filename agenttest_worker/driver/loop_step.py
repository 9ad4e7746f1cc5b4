"""One step of a conversation played on an event loop: the embedded runner's (every
conversation on the submitter's loop, agenttest_submit/run/embedded.py) and the fleet's
(every turn in flight on a worker's loop, fleet/loop_pool.py). The step is the same; what
differs is where the store's calls run, which the caller says with `offload`: on a
worker, whose store blocks (Postgres, Redis), a few threads beside the loop
(loop_pool.offload); in the embedded runner, whose store answers from memory and writes
on a thread of its own (store/memory/buffered.py), the loop's own thread (`inline`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agenttest_worker.driver import budget_counting as budget
from agenttest_worker.driver.run_cancels import RUN_CANCELS
from agenttest_worker.driver.step import (
    Advance,
    PoolCache,
    Prepared,
    _after_commit,
    commit_or_fail,
    end_without_running,
    play,
    prepare,
    stopped,
)
from agenttest_worker.engine import ConversationState
from agenttest_worker.store.conversation_store import ConversationStore

T = TypeVar("T")


class Offload(Protocol):
    """Runs one of the store's calls, `fn(*args)`, where it may block."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


async def inline(fn: Callable[..., T], /, *args: Any) -> T:
    """The store's call made on the loop's own thread: for a store that never blocks it."""
    return fn(*args)


@dataclass(frozen=True)
class TurnAddress:
    """Which turn a step plays, and how it was delivered (a fleet's message)."""

    run_id: str
    case_id: str
    turn: int
    # How many deliveries of a turn that ran alone may die with their worker (None: the
    # embedded runner, where nothing is delivered again).
    max_deliveries: int | None
    redelivered: bool = False


async def run_step(
    store: ConversationStore,
    pools: PoolCache,
    turn: TurnAddress,
    offload: Offload,
    then: Callable[[Advance], None] | None = None,
    *,
    cut: bool = True,
) -> Advance:
    """Load the conversation, play turn `turn` of it and save it; say what comes next.

    The agent calls are awaited on the loop, beside every other conversation in flight;
    the store's calls go through `offload`. `then(advance)` runs on the store's side
    right after the save (the fleet publishes what comes next there: one hand-off, not
    two). A turn whose run is cancelled meanwhile (run_cancels.py) is cut short and the
    step taken again from the store, which ends the conversation skipped (`cut`: False
    for that second time)."""
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
    state = stopped(prepared, turn.max_deliveries)
    if state is None and (
        spent := await budget.reserve(store, prepared.loaded, prepared.options, offload)
    ):
        state = end_without_running(prepared, "skip", spent)
    if state is None:
        if not cut:
            state = await play(pools, prepared)
        else:
            played = await RUN_CANCELS.unless_cancelled(turn.run_id, play(pools, prepared))
            if played is None:
                return await run_step(store, pools, turn, offload, then, cut=False)
            state = played
    return await offload(_save, store, prepared, state, then)


def _save(
    store: ConversationStore,
    prepared: Prepared,
    state: ConversationState,
    then: Callable[[Advance], None] | None,
) -> Advance:
    """Save the step and hand what comes next to `then`, on the store's side."""
    advance = _after_commit(store, prepared, commit_or_fail(store, prepared, state))
    if then is not None:
        then(advance)
    return advance
