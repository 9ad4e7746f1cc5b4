"""Thin Celery tasks: load state, call the engine, save, enqueue the next turn.

`agenttest.turn(run_id, case_id, turn)` runs one turn of one conversation; the task
that ends a run's last conversation enqueues `agenttest.aggregate(run_id)`. Task
names and arguments are plain ids, so Flower shows what is running and no secret ever
travels through the broker.

Recovering lost messages is the sweeper's (sweeper.py).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)

from agenttest_worker.agents.limits.waiting import WAITING, current_turn
from agenttest_worker.driver.event_loops import shutdown
from agenttest_worker.driver.loop_step import TurnAddress, run_step
from agenttest_worker.driver.span_intake import receive_spans, stored_spans
from agenttest_worker.driver.step import Advance, PoolCache, run_step_sync

# Registers the remote-control command that cuts a cancelled run's turns in flight.
from agenttest_worker.fleet import cancel_command as _cancel  # noqa: F401

# Connects the signals that serve a worker's metrics when AGENTTEST_METRICS_PORT is
# set. Here rather than in celery_app.py: a worker imports this module (the app's `include`)
# before it sends `celeryd_init`, and a process that only publishes never needs it.
from agenttest_worker.fleet import metrics_server as _metrics  # noqa: F401
from agenttest_worker.fleet import store_refusals
from agenttest_worker.fleet.celery_app import app
from agenttest_worker.fleet.enqueue import (
    AGGREGATE,
    START,
    TURN,
    enqueue_turns,
    follow_up,
)
from agenttest_worker.fleet.enqueue import connect as connect_publisher
from agenttest_worker.fleet.isolation import LOOP_TURNS, TURNS
from agenttest_worker.fleet.liveness import TurnInFlight
from agenttest_worker.fleet.loop_pool import DEFERRED, defer, offload, plays_on_loop
from agenttest_worker.fleet.metered import metered
from agenttest_worker.heap import settle
from agenttest_worker.observe import tracing
from agenttest_worker.report.aggregation import aggregate
from agenttest_worker.settings import get_settings
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.sql import recovery
from agenttest_worker.store.sql.cached_replies import reply_cache_at
from agenttest_worker.store.sql.db import error_reason, upgrade

log = logging.getLogger("agenttest.tasks")


def database_url() -> str:
    url = get_settings().effective_database_url()
    upgrade(url)  # a no-op after the first call in this process
    return url


_pools = PoolCache(
    replies=lambda: reply_cache_at(database_url()), spans=lambda: stored_spans(database_url())
)


_stores: dict[str, SqlStore] = {}


def _store() -> SqlStore:
    """The store the turns are played against: one per process (and database URL)."""
    url = database_url()
    store = _stores.get(url)
    if store is None:
        store = _stores[url] = metered(url)
        store_refusals.listen()  # a waiting submitter hears when the store refuses writes
    return store


@worker_process_init.connect
def _migrate_on_start(**_: Any) -> None:
    database_url()


@worker_process_shutdown.connect
def _close_io(**_: Any) -> None:
    shutdown()
    tracing.flush()  # a pool's child ends without the exit handlers that would export


@app.task(name=START)
def start(run_id: str, first: int, last: int) -> str:
    """Publish turn 1 of the run's not-yet-started conversations numbered first..last.

    The submitter publishes one of these per batch of cases instead of one message per
    case, so submitting 100,000 cases takes a few hundred publishes, and the fan-out
    happens on the fleet. Redelivered, it publishes only what has still not started.
    """
    case_ids = recovery.pending_case_ids(database_url(), run_id, first, last)
    enqueue_turns(run_id, [(case_id, 1) for case_id in case_ids])
    return f"{run_id}: started {len(case_ids)} conversation(s) ({first}-{last})"


@app.task(name=plays_on_loop(TURN), bind=True)
def turn(self: Any, run_id: str, case_id: str, turn: int) -> str:
    # Set by the broker on a message it gave back (its worker died or was too slow).
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    properties = self.request.properties or {}
    in_flight = TurnInFlight(run_id, case_id, turn, properties.get("delivery_tag"))
    address = TurnAddress(run_id, case_id, turn, get_settings().max_redeliveries, redelivered)
    if defer(lambda: _play_on_loop(address, in_flight)):
        # The loop pool plays it and finishes the task when it ends (loop_pool.py).
        return DEFERRED
    # A redelivered turn runs alone in this process, so that a worker's death is blamed
    # only on a turn that was running alone (isolation.py); waiting for that, and for
    # agents (rate limits, back-offs), it is marked alive (liveness.py).
    waits = WAITING.holding(in_flight)
    with current_turn(in_flight), TURNS.alone(waits) if redelivered else TURNS.shared(waits):
        advance = run_step_sync(
            _store(),
            _pools,
            run_id,
            case_id,
            turn,
            max_deliveries=address.max_deliveries,
            redelivered=redelivered,
        )
    follow_up(run_id, case_id, advance)
    return _played(address, advance)


async def _play_on_loop(address: TurnAddress, in_flight: TurnInFlight) -> str:
    """The turn task's body on the loop pool: the same step, with the same isolation of
    redelivered turns, as a coroutine; the store and the broker are called on threads."""
    waits = WAITING.holding(in_flight)
    with current_turn(in_flight):
        alone = LOOP_TURNS.alone(waits) if address.redelivered else LOOP_TURNS.shared(waits)
        async with alone:
            advance = await run_step(
                _store(),
                _pools,
                address,
                offload,
                then=functools.partial(follow_up, address.run_id, address.case_id),
            )
    return _played(address, advance)


def _played(address: TurnAddress, advance: Advance) -> str:
    """What the task returns: Flower's and the worker log's line for the turn."""
    case_id, turn = address.case_id, address.turn
    if advance.gone:
        return f"{case_id} turn {turn}: not run, its run is no longer stored"
    if not advance.saved:
        return f"{case_id} turn {turn}: already recorded"
    if advance.case_done:
        return f"{case_id} turn {turn}: case {advance.status}"
    if advance.awaiting_human:
        return f"{case_id} turn {turn}: waiting for a person"
    return f"{case_id} turn {turn}: next turn {advance.next_turn}"


@app.task(name=AGGREGATE)
def aggregate_run(run_id: str) -> str:
    done = aggregate(database_url(), run_id) is not None
    return f"{run_id}: aggregated" if done else f"{run_id}: already aggregated"


@worker_ready.connect
def _warm_up(sender: Any = None, **_: Any) -> None:
    """Do now what the first tasks would do on their own, then settle the heap (heap.py).

    Imports: a hundred turns taking their first step at once would each wait on the
    import lock and the GIL for modules kept off the submitter's start-up path. aiohttp,
    which every agent call goes through, is imported by the loop pool's `configure_pool`
    (agents/http/exchange.py), and in the other pools by the first call.

    Connections, where tasks run in this process (the loop pool, threads): the database,
    whose schema `worker_process_init` brings current only in prefork's children, so
    that here the first task did it, importing the driver and the Postgres dialect
    and connecting; and the broker connection turns are published on. Made here, they
    are not paid for by the first turn of the first run a worker takes. Not in a prefork parent:
    its children, forked again later, would inherit those connections. What cannot be reached now,
    the first task tries again.
    """
    from celery.concurrency.prefork import TaskPool as PreforkPool

    if not get_settings().shared_redis_url:
        log.warning(
            "the broker is not Redis and AGENTTEST_REDIS_URL is unset: agents' rate limits "
            "and breakers are kept per process, not shared by the fleet"
        )
    if not isinstance(getattr(sender, "pool", None), PreforkPool):
        try:
            database_url()
            connect_publisher()
        except Exception as exc:
            log.warning("could not connect at start-up; the first task will: %s", error_reason(exc))
        _receive_spans()
    elif get_settings().otlp_receiver_port is not None:
        log.warning("AGENTTEST_OTLP_RECEIVER_PORT: a prefork worker receives no spans")
    settle()


def _receive_spans() -> None:
    """Serve the OTLP receiver (driver/span_intake.py) for as long as the worker runs."""
    try:
        receive_spans(get_settings().effective_database_url())
    except OSError as exc:
        log.warning("AGENTTEST_OTLP_RECEIVER_PORT: cannot receive spans: %s", exc)
