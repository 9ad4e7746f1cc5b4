"""Run budgets: tokens and cost, counted from every agent call's usage.

Cost is computed from each agent's `pricing` in agenttest.yaml (per million prompt and
completion tokens); agents without pricing cost nothing. The run's totals move with
each saved turn when a budget is set, and a turn that would start after the budget is
spent is not started: its case ends skipped with the reason. Before it calls an agent,
a turn reserves its estimated usage (`reserve`, store/reservations.py), so that turns
running at once on a fleet cannot all see the budget unspent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.limits.waiting import waiting
from agenttest_worker.engine import RunOptions
from agenttest_worker.engine.outcome import call_cost
from agenttest_worker.results import AgentCallRecord, TurnResult
from agenttest_worker.store.conversation_store import ConversationStore
from agenttest_worker.store.reservations import FIRST_TURN_WAIT, Reservation, TurnReservation
from agenttest_worker.store.steps import LoadedCase

# How often a turn waiting for the run's first usage asks again (seconds).
WAIT_TICK = 0.05


def calls_cost(calls: Iterable[AgentCallRecord], config: ProjectConfig) -> float:
    # Priced as each case's usage_by_role is (engine/outcome.py), so the two agree.
    return sum(call_cost(call, config) for call in calls)


def turns_spend(turns: Iterable[TurnResult], config: ProjectConfig) -> tuple[int, float]:
    """(tokens, cost) of what these turns' calls used."""
    tokens, cost = 0, 0.0
    for turn in turns:
        calls = turn.calls or []
        tokens += sum(c.usage.total_tokens for c in calls if c.usage is not None)
        cost += calls_cost(calls, config)
    return tokens, cost


def budget_spent(
    options: RunOptions, tokens: int, cost: float, held_tokens: int = 0, held_cost: float = 0.0
) -> str | None:
    """Why no new turn may start, or None while the budget lasts. `held_*`: what turns
    running now have reserved of it."""
    if options.max_tokens is not None and tokens + held_tokens >= options.max_tokens:
        held = f", {held_tokens:,} more reserved by turns running" if held_tokens else ""
        return (
            f"not run: the run's token budget ({options.max_tokens:,}) was spent "
            f"({tokens:,} used{held})"
        )
    if options.max_cost is not None and cost + held_cost >= options.max_cost:
        held = f", {held_cost:.4f} more reserved by turns running" if held_cost else ""
        return (
            f"not run: the run's cost budget ({options.max_cost:g}) was spent "
            f"({cost:.4f} used{held})"
        )
    return None


def reserve_sync(store: ConversationStore, loaded: LoadedCase, options: RunOptions) -> str | None:
    """Reserve the turn about to run; None when it may run, else why its case ends.

    Waits (a worker thread) while the run's first turn runs alone, at most
    FIRST_TURN_WAIT seconds. A run without a budget costs nothing here."""
    if not options.budgeted:
        return None
    give_up = time.monotonic() + FIRST_TURN_WAIT
    found = _reserve(store, loaded, options, give_up)
    if found.outcome == "wait":
        # Marked alive while it waits (fleet/liveness.py): not a lost turn to hand out.
        with waiting():
            while (found := _reserve(store, loaded, options, give_up)).outcome == "wait":
                time.sleep(WAIT_TICK)
    return _refused(options, found)


async def reserve(
    store: ConversationStore,
    loaded: LoadedCase,
    options: RunOptions,
    offload: Callable[..., Awaitable[Reservation]],
) -> str | None:
    """`reserve_sync` for a step played on an event loop (driver/loop_step.py): the store
    is asked through `offload`, and the wait is a sleep on the loop, which lets the other
    conversations, the first turn among them, go on; a fleet's turn is marked alive
    meanwhile."""
    if not options.budgeted:
        return None
    give_up = time.monotonic() + FIRST_TURN_WAIT
    found = await offload(_reserve, store, loaded, options, give_up)
    if found.outcome == "wait":
        with waiting():
            while (
                found := await offload(_reserve, store, loaded, options, give_up)
            ).outcome == "wait":
                await asyncio.sleep(WAIT_TICK)
    return _refused(options, found)


def _reserve(
    store: ConversationStore, loaded: LoadedCase, options: RunOptions, give_up: float
) -> Reservation:
    turn = TurnReservation(
        loaded.run_id,
        loaded.case_id,
        options.max_tokens,
        options.max_cost,
        expired=time.monotonic() > give_up,
    )
    return store.reserve_turn(turn)


def _refused(options: RunOptions, found: Reservation) -> str | None:
    if found.outcome == "reserved":
        return None
    return budget_spent(
        options, found.tokens, found.cost, found.held_tokens, found.held_cost
    ) or budget_spent(options, options.max_tokens or 0, options.max_cost or 0.0)
