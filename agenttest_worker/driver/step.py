"""The body of a turn task: load a conversation, run one engine step, save it.

Shared by the Celery task (tasks.py) and the embedded runner, so that both execute
exactly the same steps against the same store. Loading and saving are synchronous
(they run in the task's thread); the engine step is a coroutine (agent calls share one
event loop and its connection pool).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.cases.case_model import Case
from agenttest_worker.driver import budget_counting as budget
from agenttest_worker.driver import state_cache
from agenttest_worker.driver.adaptive_repeats import repeat_plan
from agenttest_worker.driver.budget_counting import budget_spent, turns_spend
from agenttest_worker.driver.event_loops import run_sync

# PoolCache is imported from here by the runners (embedded.py, fleet/tasks.py).
from agenttest_worker.driver.run_cache import PoolCache as PoolCache
from agenttest_worker.driver.run_cache import (
    case_of,
    options_of,
    pricing_config,
    run_config,
)
from agenttest_worker.driver.state_cache import session_id as session_id
from agenttest_worker.driver.turn_spans import conversation_ended, traced_turn
from agenttest_worker.driver.unrecorded_calls import count_unrecorded, refused_for_now
from agenttest_worker.durations import format_duration
from agenttest_worker.engine import (
    ConversationState,
    RunOptions,
    case_result,
    run_turn,
)
from agenttest_worker.errors import ConfigError
from agenttest_worker.results import DEADLINE_PASSED, TurnResult
from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import ConversationStore

T = TypeVar("T")


@dataclass
class Advance:
    """What the caller must do after a step."""

    saved: bool
    next_turn: int | None = None
    run_finished: bool = False
    awaiting_human: bool = False
    case_done: bool = False
    status: str | None = None
    # The conversation is not in the store: its run was removed (or never stored).
    gone: bool = False
    # Conversations (seq first..last) to start now: this step ended one of a run capped
    # by --parallel on a fleet, and claimed the next (steps.Saved.starts).
    starts: tuple[int, int] | None = None
    # A conversation to start now: the next repetition of a case of --repeat auto.
    added: str | None = None


@dataclass
class Prepared:
    loaded: steps.LoadedCase
    case: Case
    state: ConversationState
    options: RunOptions
    turn: int
    # This delivery was counted in the store (a redelivery, run alone: fleet/isolation.py).
    counted: bool = False
    # How many of the state's first turns are stored as turn records (state_cache.py).
    archived: int | None = None
    # Why the stored conversation cannot be read (then `state` is a new one, to end it).
    unreadable: str | None = None


def _spend(
    options: RunOptions, loaded: steps.LoadedCase, turns: list[TurnResult]
) -> tuple[int, float] | None:
    """What the step's turns used, when the run has a budget to count it against."""
    if not options.budgeted or not turns:
        return None
    return turns_spend(turns, run_config(loaded.run_id, loaded.run_config))


def prepare(
    store: ConversationStore,
    run_id: str,
    case_id: str,
    turn: int,
    max_deliveries: int | None = None,
    redelivered: bool = False,
) -> Prepared | Advance:
    """Load what turn `turn` needs, or say why there is nothing to do (an Advance).

    Only a redelivery (a message the broker gave back after a worker died) is counted
    in the store: a first delivery costs no write, which keeps the hot path to one read
    and one write transaction per turn. The fleet runs a redelivered step alone in its
    worker (fleet/isolation.py), so a count says the turn ran alone.
    """
    count = max_deliveries is not None and redelivered
    loaded = store.load_case(run_id, case_id, count_delivery=count, turn=turn)
    if loaded is None:
        return Advance(saved=False, gone=True)
    if loaded.phase == "done":
        # A redelivery of the step that ended the run may be all that is left of it: its
        # worker died after saving the step but before enqueueing the aggregation. So a
        # redelivered copy asks for the aggregation again while the run still needs one
        # (claim_aggregation lets one of several happen); a plain duplicate does not.
        return Advance(
            saved=False, case_done=True, run_finished=redelivered and loaded.run_complete
        )
    if loaded.next_turn != turn or loaded.phase not in ("pending", "ready"):
        # A duplicate or stale message: nothing to do. Except when the broker gave back
        # the message of a worker that died after saving the turn but before enqueueing
        # the next one: then enqueue that now (its own guard makes a double harmless).
        # Only a redelivery can be that; a plain duplicate stays a no-op instead of
        # spawning a second copy of the rest of the conversation.
        resend = redelivered and loaded.phase == "ready" and loaded.next_turn == turn + 1
        return Advance(saved=False, next_turn=loaded.next_turn if resend else None)
    return prepared_for(store, loaded, turn, count) or Advance(saved=False)


def prepared_for(
    store: ConversationStore, loaded: steps.LoadedCase, turn: int, counted: bool = False
) -> Prepared | None:
    """Turn `turn` of `loaded` with its state (state_cache.load), or None: moved on.

    A stored state that cannot be read (nested past the parser's limit, stored before
    replies were bounded) would fail each time the turn is played: it comes with a new
    state and `unreadable` saying why, and `stopped` ends it failed."""
    try:
        found = state_cache.load(store, loaded)
    except (ValueError, RecursionError) as exc:
        state_cache.forget(loaded)
        fresh = state_cache.stored(dataclasses.replace(loaded, state=None))
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        reason = f"its stored conversation cannot be read: {first_line}"
        return dataclasses.replace(_prepared_from(loaded, fresh, turn, counted), unreadable=reason)
    if found is None:
        return None
    loaded, stored = found
    return _prepared_from(loaded, stored, turn, counted)


def _prepared_from(
    loaded: steps.LoadedCase, stored: state_cache.Stored, turn: int, counted: bool
) -> Prepared:
    case, options = case_of(loaded), options_of(loaded)
    if loaded.deadline_at is None:
        # Parsed: a turn waiting on its agent need not hold the state's text as well, nor
        # the case's, which it holds validated (thousands wait on a worker). A run with a
        # --deadline reads the state again when a turn is cut short
        # (execute_until_deadline), from the case for its first turn.
        loaded = dataclasses.replace(loaded, state=None, turn_records=None, case="")
    return Prepared(loaded, case, stored.state, options, turn, counted, stored.archived)


def _state(loaded: steps.LoadedCase) -> ConversationState:
    """The conversation's state as stored, or a new one before its first turn."""
    return state_cache.stored(loaded).state


def stop_reason(prepared: Prepared, max_deliveries: int | None) -> tuple[str, str] | None:
    """(kind, message) when the conversation must end without running the turn."""
    loaded = prepared.loaded
    if loaded.run_cancelled:
        return "skip", loaded.cancel_reason or "run cancelled"
    if prepared.options.budgeted and (
        spent := budget_spent(prepared.options, loaded.run_tokens, loaded.run_cost)
    ):
        return "skip", spent
    if loaded.deadline_at is not None and time.time() > loaded.deadline_at:
        return "fail", DEADLINE_PASSED
    # `deliveries` counts the deliveries of this turn that ran alone in their worker
    # (this one included when it was counted): each of those before this one died with
    # its worker, and only those are this turn's doing (fleet/isolation.py). The first
    # delivery, which ran beside other turns, died too but is blamed on nobody.
    alone = loaded.deliveries - (1 if prepared.counted else 0)
    if max_deliveries is not None and alone >= max_deliveries:
        return "fail", (
            f"turn {prepared.turn} was delivered {alone + 2} times without finishing "
            f"(the worker running it died each time, {alone} of them with this turn "
            "running alone)"
        )
    return None


# `execute`, `execute_until_deadline` and `play` hand back the engine's
# coroutine rather than awaiting it in one of their own: a coroutine per layer is a
# frame held by every turn waiting on its agent, thousands of them on a worker.


def execute(prepared: Prepared, pool: AgentPool) -> Coroutine[Any, Any, ConversationState]:
    # The state was loaded for this step alone: the engine may update it in place.
    return run_turn(prepared.case, prepared.state, pool, prepared.options, in_place=True)


def execute_until_deadline(
    prepared: Prepared, pool: AgentPool
) -> Coroutine[Any, Any, ConversationState]:
    """`execute`, cancelled at the run's --deadline: then the conversation as stored
    before this turn ends failed with the deadline as its reason (the embedded runner
    cancels its turns in flight at the deadline the same way, embedded.drive)."""
    if prepared.loaded.deadline_at is None:
        return execute(prepared, pool)
    return _until_deadline(prepared, pool, prepared.loaded.deadline_at)


async def _until_deadline(
    prepared: Prepared, pool: AgentPool, deadline_at: float
) -> ConversationState:
    # (In this task, not a new one: see engine/turn.py.)
    played = await cut_at(deadline_at, execute(prepared, pool))
    if played is not None:
        return played
    # The engine updated the loaded state in place, partway: start again from the stored.
    before = dataclasses.replace(prepared, state=_state(prepared.loaded))
    return end_without_running(before, "fail", DEADLINE_PASSED)


async def cut_at(deadline_at: float, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None once the wall clock's `deadline_at` came first (`work`
    cancelled); a TimeoutError of `work`'s own is raised.

    Whose timeout it was is asked of the timeout, not of the clock: a loop's timer may
    fire a hair before `deadline_at` by the wall clock (uvloop's, to the millisecond:
    ~1% of them), and a turn cut short by the deadline then raised out of its task,
    its conversation left pending with nobody to end it."""
    deadline = asyncio.timeout(max(deadline_at - time.time(), 0))
    try:
        async with deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise  # not the deadline's
    return None


def end_without_running(prepared: Prepared, kind: str, message: str) -> ConversationState:
    state = prepared.state.model_copy(deep=True)
    state.next_input = None
    state.phase = "done"
    if kind == "skip":
        state.skip_reason = message
    else:
        state.error = message
    return state


def commit(
    store: ConversationStore,
    prepared: Prepared,
    state: ConversationState,
    expected_phase: str | None = None,
) -> Advance:
    """Save the step's outcome once; say what to enqueue next. (`expected_phase`: the
    conversation is parked there rather than running, see save_step.)"""
    loaded = prepared.loaded
    new_turns: list[TurnResult] = [t for t in state.turns if t.turn >= prepared.turn]
    result = None
    if state.phase == "done":
        result = case_result(prepared.case, state, loaded.agent, pricing_config(loaded))
    next_turn = state.turns_run + 1
    step = steps.StepSave(
        run_id=loaded.run_id,
        case_id=loaded.case_id,
        expected_turn=prepared.turn,
        next_turn=next_turn,
        phase=state.phase,
        new_turns=new_turns,
        final_assertions=state.final_assertions if result else (),
        result=result,
        expected_phase=expected_phase,
        spend=_spend(prepared.options, loaded, new_turns),
        budgeted=prepared.options.budgeted,
        budget_turns=len(new_turns) if prepared.options.budgeted else 0,
        stop_run=_fail_fast_reason(prepared, result.status if result else None),
        repeat_plan=repeat_plan(prepared.case, prepared.options) if result else None,
    )
    saved = state_cache.save(store, loaded, prepared.archived, state, step)
    if not saved.saved:
        count_unrecorded(store, loaded, new_turns)
        return Advance(saved=False)
    if result is not None:
        conversation_ended(loaded.run_id, state, result)
    return Advance(
        saved=True,
        next_turn=next_turn if state.phase == "ready" else None,
        run_finished=saved.run_finished,
        awaiting_human=state.phase == "awaiting_human",
        case_done=result is not None,
        status=result.status if result else None,
        starts=saved.starts,
        added=saved.added,
    )


def _fail_fast_reason(prepared: Prepared, status: str | None) -> str | None:
    """Why the run stops as this step ends its case with `status`, under --fail-fast."""
    if status != "failed" or not prepared.options.fail_fast:
        return None
    return f"not run: --fail-fast stopped the run after {prepared.case.id} failed"


def commit_or_fail(
    store: ConversationStore, prepared: Prepared, state: ConversationState
) -> Advance:
    """`commit`, or, when the database refuses what the step produced (a value it cannot
    hold, such as a token count past its column's range), the case ended as failed with
    the database's reason. Raised, the task would fail the same way each time the turn
    is played again, and the run would never finish."""
    loaded = prepared.loaded
    try:
        return saved_or_refused(
            store,
            loaded.run_id,
            loaded.case_id,
            prepared.turn,
            lambda: commit(store, prepared, state),
        )
    except Exception as exc:
        if refused_for_now(exc):
            # Refused for longer than the store's patience (db.reconnecting): the turn
            # will be played again, and these calls were made and paid for.
            count_unrecorded(store, loaded, (t for t in state.turns if t.turn >= prepared.turn))
        raise


def saved_or_refused(
    store: ConversationStore,
    run_id: str,
    case_id: str,
    turn: int,
    save: Callable[[], Advance],
) -> Advance:
    """`save()`, or when the database refuses what it writes, `end_refused`."""
    try:
        return save()
    except Exception as exc:
        # Imported here, not above: an embedded run's first saves go to memory on the
        # event loop while a thread imports SQLAlchemy, and importing the store module
        # here made every conversation wait for that import.
        from agenttest_worker.store.sql.db import unstorable_reason

        reason = unstorable_reason(exc)
        if reason is None:
            raise
    # The engine updated the loaded state in place, with the turn that was refused: the
    # conversation as stored before this turn (nothing of it was written) ends instead.
    return end_refused(store, run_id, case_id, turn, reason)


def end_refused(
    store: ConversationStore, run_id: str, case_id: str, turn: int, reason: str
) -> Advance:
    """End a conversation whose step `turn` the database refused, as failed with the
    database's reason: as it is stored, before that step (nothing of it was written)."""
    loaded = store.load_case(run_id, case_id)
    if loaded is None or loaded.phase == "done" or loaded.next_turn != turn:
        return Advance(saved=False)  # recorded meanwhile by a copy of this message, or ended
    before = prepared_for(store, loaded, turn)
    if before is None:
        return Advance(saved=False)
    message = f"turn {turn} could not be stored: {reason}"
    # A person's reply is what was refused when the conversation is still parked for one.
    parked = "awaiting_human" if before.loaded.phase == "awaiting_human" else None
    return commit(store, before, end_without_running(before, "fail", message), parked)


def stopped(prepared: Prepared, max_deliveries: int | None) -> ConversationState | None:
    if prepared.unreadable is not None:
        message = f"turn {prepared.turn} could not be played: {prepared.unreadable}"
        return end_without_running(prepared, "fail", message)
    if prepared.state.phase == "done":
        # Ended before its first turn ("no initial input"): its own reason stands, not a
        # cancellation's or a deadline's on top of it.
        return None
    reason = stop_reason(prepared, max_deliveries)
    return end_without_running(prepared, *reason) if reason else None


def _after_commit(store: ConversationStore, prepared: Prepared, advance: Advance) -> Advance:
    # A SqlStore cancelled the run in the step's own write (Step.stop_run); the embedded
    # store is cancelled here, before its event loop runs anything else.
    if reason := _fail_fast_reason(prepared, advance.status):
        store.cancel_run(prepared.loaded.run_id, reason)
    return advance


def run_step_sync(
    store: ConversationStore,
    pools: PoolCache,
    run_id: str,
    case_id: str,
    turn: int,
    max_deliveries: int | None,
    redelivered: bool = False,
) -> Advance:
    """One step from a worker thread: database here, agent calls on the process's loop."""
    prepared = prepare(store, run_id, case_id, turn, max_deliveries, redelivered)
    if isinstance(prepared, Advance):
        return prepared
    state = stopped(prepared, max_deliveries)
    if state is None and (spent := budget.reserve_sync(store, prepared.loaded, prepared.options)):
        state = end_without_running(prepared, "skip", spent)
    if state is None:
        state = run_sync(play(pools, prepared))
    return _after_commit(store, prepared, commit_or_fail(store, prepared, state))


def play(pools: PoolCache, prepared: Prepared) -> Coroutine[Any, Any, ConversationState]:
    """The turn of a step once it may run: played with the run's agents until the run's
    --deadline, or ended failed when this process cannot read its agenttest.yaml."""
    pool = _pool_or_failure(pools, prepared)
    if isinstance(pool, ConversationState):
        return _ready(pool)
    return traced_turn(prepared, execute_until_deadline(prepared, pool), pools.spans())


async def _ready(state: ConversationState) -> ConversationState:
    return state


def _pool_or_failure(pools: PoolCache, prepared: Prepared) -> AgentPool | ConversationState:
    """The run's agents, or the conversation ended failed when this process cannot read
    the run's agenttest.yaml (a ${VAR} set where the run was submitted but not here): as
    a task failure the turn would be played again for ever and the run never finish."""
    loaded = prepared.loaded
    try:
        return pools.for_run(loaded.run_id, loaded.run_config, prepared.options)
    except ConfigError as exc:
        where = "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in exc.problems)
        return end_without_running(
            prepared, "fail", f"agenttest.yaml cannot be read where this turn ran: {where}"
        )


def timeout_message(seconds: float) -> str:
    return f"no answer within {format_duration(seconds)}"
