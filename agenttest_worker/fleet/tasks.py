"""Thin Celery tasks: load state, call the engine, save, enqueue the next turn.

`agenttest.turn(run_id, case_id, turn)` runs one turn of one conversation; the task
that ends a run's last conversation enqueues `agenttest.aggregate(run_id)`. Task
names and arguments are plain ids, so Flower shows what is running and no secret ever
travels through the broker.

Recovering lost messages. acks_late + the visibility timeout bring back the message of
a worker that died, but not a message the broker itself lost: Redis without
persistence forgets its queues when it restarts, and a publish can fail for good after
its retries. Nothing in the broker then remembers the conversation; the store does. So
every worker runs a sweeper thread (`recover`, every `sweep_interval()` seconds; or,
with AGENTTEST_WORKER_SWEEPER=false, `celery beat` sends `agenttest.sweep` instead) that
looks for running runs none of whose conversations has moved (no turn started or
saved) for AGENTTEST_STALL_SECONDS and re-enqueues each waiting conversation's
`next_turn` (claimed in the store, so one sweeper does it, once per stall period), and
builds the reports of runs that finished but were never aggregated (the aggregation
message was lost, or the aggregator died holding the claim). Re-enqueueing is safe
because a step is idempotent on (run, case, next_turn): a copy of a message that was
not lost after all finds its turn already recorded and does nothing. The submitter's
--wait loop runs the same `recover` for its own run, in case no worker sweeps.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from sqlalchemy.exc import DBAPIError

from agenttest_worker.driver.step import Advance, PoolCache, run_step_sync
from agenttest_worker.fleet.aggregate import aggregate
from agenttest_worker.fleet.app import CONTINUING, NEW_CONVERSATION, app, sweep_interval
from agenttest_worker.settings import get_settings
from agenttest_worker.store import recovery
from agenttest_worker.store.base import SqlStore
from agenttest_worker.store.db import error_reason, is_connection_lost, upgrade

log = logging.getLogger("agenttest.tasks")
_pools = PoolCache()


def _url() -> str:
    url = get_settings().effective_database_url()
    upgrade(url)  # a no-op after the first call in this process
    return url


_stores: dict[str, SqlStore] = {}


def _store() -> SqlStore:
    """The store the turns are played against: one per process (and database URL)."""
    url = _url()
    store = _stores.get(url)
    if store is None:
        store = _stores[url] = SqlStore(url)
    return store


@worker_process_init.connect
def _migrate_on_start(**_: Any) -> None:
    _url()


@worker_process_shutdown.connect
def _close_io(**_: Any) -> None:
    from agenttest_worker.driver.event_loops import shutdown

    shutdown()


def enqueue_turn(run_id: str, case_id: str, number: int, producer: Any = None) -> None:
    """Publish `agenttest.turn(run_id, case_id, number)`.

    The arguments' display form (what Flower shows) is written here rather than left
    to Celery's `saferepr`, which walks the arguments on every publish; ids are plain
    strings, so `repr` says the same.
    """
    turn.apply_async(
        (run_id, case_id, number),
        producer=producer,
        # A first turn waits behind the turns of conversations under way (celery_app.py).
        priority=NEW_CONVERSATION if number == 1 else CONTINUING,
        argsrepr=f"({run_id!r}, {case_id!r}, {number})",
        kwargsrepr="{}",
    )


def enqueue_start(run_id: str, first: int, last: int, producer: Any = None) -> None:
    """Publish `agenttest.start` for the run's cases numbered first..last.

    It starts new conversations, so it waits with their first turns: behind every turn
    of the conversations under way, and in order with the first turns already queued.
    (At the higher priority, the batches a large run's submitter publishes as it stores
    its cases kept every first turn waiting until the last batch was stored.)
    """
    start.apply_async((run_id, first, last), producer=producer, priority=NEW_CONVERSATION)


def follow_up(run_id: str, case_id: str, advance: Advance) -> None:
    """Enqueue what the step asked for: the next turn, the aggregation."""
    if advance.next_turn is not None:
        enqueue_turn(run_id, case_id, advance.next_turn)
    if advance.run_finished:
        aggregate_run.apply_async((run_id,))


@app.task(name="agenttest.start")
def start(run_id: str, first: int, last: int) -> str:
    """Publish turn 1 of the run's not-yet-started conversations numbered first..last.

    The submitter publishes one of these per batch of cases instead of one message per
    case, so submitting 100,000 cases takes a few hundred publishes, and the fan-out
    happens on the fleet. Redelivered, it publishes only what has still not started.
    """
    case_ids = recovery.pending_case_ids(_url(), run_id, first, last)
    with app.producer_or_acquire() as producer:
        for case_id in case_ids:
            enqueue_turn(run_id, case_id, 1, producer)
    return f"{run_id}: started {len(case_ids)} conversation(s) ({first}-{last})"


@app.task(name="agenttest.turn", bind=True)
def turn(self: Any, run_id: str, case_id: str, turn: int) -> str:
    # Set by the broker on a message it gave back (its worker died or was too slow).
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    advance = run_step_sync(
        _store(),
        _pools,
        run_id,
        case_id,
        turn,
        max_deliveries=get_settings().max_redeliveries,
        redelivered=redelivered,
    )
    follow_up(run_id, case_id, advance)
    if advance.gone:
        return f"{case_id} turn {turn}: not run, its run is no longer stored"
    if not advance.saved:
        return f"{case_id} turn {turn}: already recorded"
    if advance.case_done:
        return f"{case_id} turn {turn}: case {advance.status}"
    if advance.awaiting_human:
        return f"{case_id} turn {turn}: waiting for a person"
    return f"{case_id} turn {turn}: next turn {advance.next_turn}"


@app.task(name="agenttest.aggregate")
def aggregate_run(run_id: str) -> str:
    done = aggregate(_url(), run_id) is not None
    return f"{run_id}: aggregated" if done else f"{run_id}: already aggregated"


# -- recovering lost messages (see the module docstring) ----------------------------------


def recover(url: str, stall_seconds: float, run_id: str | None = None) -> tuple[int, int]:
    """Re-enqueue conversations of stalled runs; build lost aggregations.

    Returns (turns re-enqueued, runs aggregated here). `run_id` limits it to one run.
    A run its submitter left half stored is closed first (cancelled with the reason),
    so that this same pass enqueues its conversations or aggregates it.
    """
    for closed in recovery.close_abandoned_runs(url, stall_seconds, run_id):
        log.warning(
            "run %s: closed, %s",
            closed.run_id,
            recovery.ABANDONED_REASON.format(stored=closed.stored),
        )
    stalled = recovery.claim_stalled(url, stall_seconds, run_id)
    if stalled:
        with app.producer_or_acquire() as producer:
            for stalled_run, case_id, next_turn in stalled:
                enqueue_turn(stalled_run, case_id, next_turn, producer)
        log.warning(
            "re-enqueued %d conversation(s) not moved for %ss (lost messages): %s",
            len(stalled),
            stall_seconds,
            ", ".join(f"{r}/{c} turn {t}" for r, c, t in stalled[:20]),
        )
    aggregated = 0
    for lost in recovery.unaggregated_runs(url, stall_seconds, run_id):
        if aggregate(url, lost) is not None:
            aggregated += 1
            log.warning("run %s: reports built by the sweeper (its aggregation was lost)", lost)
    return len(stalled), aggregated


@app.task(name="agenttest.sweep")
def sweep() -> str:
    """One `recover` pass over every running run (what Celery beat schedules)."""
    requeued, aggregated = recover(_url(), get_settings().stall_seconds)
    return f"re-enqueued {requeued} conversation(s), aggregated {aggregated} run(s)"


class Sweeper(threading.Thread):
    """The worker's background `recover` loop; every worker runs one (claims make it safe)."""

    def __init__(self, stall_seconds: float) -> None:
        super().__init__(name="agenttest-sweeper", daemon=True)
        self.stall_seconds = stall_seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(sweep_interval(self.stall_seconds)):
            try:
                recover(_url(), self.stall_seconds)
            except DBAPIError as exc:
                # The database is restarting: say so in one line per sweep, not a traceback.
                lost = is_connection_lost(exc)
                log.warning(
                    "sweep for lost messages failed; retrying%s",
                    f" (database unreachable: {error_reason(exc)})" if lost else "",
                    exc_info=not lost,
                )
            except Exception:  # the broker is down: try again next time
                log.warning("sweep for lost messages failed; retrying", exc_info=True)


_sweeper: Sweeper | None = None


@worker_ready.connect
def _warm_up(**_: Any) -> None:
    """Import now what the first turns would import on their own (a hundred threads
    taking their first turn at once would each wait on the import lock and the GIL for
    modules kept off the submitter's start-up path), then settle the heap (heap.py)."""
    import aiohttp  # noqa: F401  (agents/transport.py imports it where a call is made)

    from agenttest_worker.driver.event_loops import run_sync  # noqa: F401
    from agenttest_worker.heap import settle

    settle()


@worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    global _sweeper
    settings = get_settings()
    if not settings.distributed or not settings.worker_sweeper or _sweeper is not None:
        return
    _sweeper = Sweeper(settings.stall_seconds)
    _sweeper.start()


@worker_shutdown.connect
def _stop_sweeper(**_: Any) -> None:
    if _sweeper is not None:
        _sweeper.stopping.set()
