"""The sweeper: recovering conversations whose messages the broker lost.

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
import time
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from sqlalchemy.exc import DBAPIError

from agenttest_worker.fleet import worker_presence
from agenttest_worker.fleet.celery_app import REDIS_BROKER, app, sweep_interval
from agenttest_worker.fleet.enqueue import enqueue_starts, enqueue_turn
from agenttest_worker.fleet.tasks import database_url
from agenttest_worker.observe import metrics
from agenttest_worker.report.aggregation import aggregate
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import recovery
from agenttest_worker.store.sql.db import error_reason, is_connection_lost, is_transient

log = logging.getLogger("agenttest.tasks")  # the name deployments filter on


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
        metrics.recovered("turn", len(stalled))
        log.warning(
            "re-enqueued %d conversation(s) not moved for %ss (lost messages): %s",
            len(stalled),
            stall_seconds,
            ", ".join(f"{r}/{c} turn {t}" for r, c, t in stalled[:20]),
        )
    for capped_run, first, last in recovery.claim_stalled_starts(url, stall_seconds, run_id):
        enqueue_starts(capped_run, first, last)
        metrics.recovered("start", last - first + 1)
        log.warning("run %s: started conversations %d-%d left unstarted", capped_run, first, last)
    aggregated = 0
    for lost in recovery.unaggregated_runs(url, stall_seconds, run_id):
        if _aggregated(url, lost):
            aggregated += 1
            metrics.recovered("aggregation")
            log.warning("run %s: reports built by the sweeper (its aggregation was lost)", lost)
    return len(stalled), aggregated


def restore_gone_workers() -> int:
    """Give back the messages of workers that are gone (worker_presence.py); how many."""
    if not REDIS_BROKER:
        return 0  # RabbitMQ gives them back itself when the worker's connection closes
    presence = worker_presence.current()
    restored = worker_presence.restore_gone_workers(presence.id if presence else None)
    for worker, count in restored.items():
        metrics.recovered("turn", count)
        log.warning(
            "worker %s is gone (no presence mark for %ss): gave its %d message(s) back",
            worker,
            get_settings().worker_gone_seconds,
            count,
        )
    return sum(restored.values())


def _aggregated(url: str, run_id: str) -> bool:
    """Whether this pass built the run's reports. A run whose aggregation fails is said
    in the log and left for the next pass once its claim's lease has run out (the claim
    marks it `aggregating` meanwhile): the sweep goes on with the other runs, which one
    such run used to keep waiting for ever. A lost database still ends the pass."""
    try:
        return aggregate(url, run_id) is not None
    except DBAPIError as exc:
        if is_transient(exc):
            raise
        failed: Exception = exc
    except Exception as exc:
        failed = exc
    log.error(
        "run %s: its reports could not be built (%s); the sweep goes on with the other runs",
        run_id,
        error_reason(failed),
        exc_info=failed,
    )
    return False


@app.task(name="agenttest.sweep")
def sweep() -> str:
    """One `recover` pass over every running run (what Celery beat schedules)."""
    gone = restore_gone_workers()
    requeued, aggregated = recover(database_url(), get_settings().stall_seconds)
    return (
        f"gave back {gone} message(s) of gone workers, re-enqueued {requeued} "
        f"conversation(s), aggregated {aggregated} run(s)"
    )


# How often the sweeper looks for workers that are gone: their turns come back within
# this of their presence mark expiring.
GONE_CHECK_SECONDS = 1.0


class Sweeper(threading.Thread):
    """The worker's background `recover` loop; every worker runs one (claims make it safe)."""

    def __init__(self, stall_seconds: float) -> None:
        super().__init__(name="agenttest-sweeper", daemon=True)
        self.stall_seconds = stall_seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        every = sweep_interval(self.stall_seconds)
        tick = min(GONE_CHECK_SECONDS, every) if REDIS_BROKER else every
        next_sweep = time.monotonic() + every
        while not self.stopping.wait(tick):
            if REDIS_BROKER:
                try:
                    restore_gone_workers()
                except Exception:  # the broker is down: try again next tick
                    log.warning("looking for workers that are gone failed; retrying", exc_info=True)
            if time.monotonic() < next_sweep:
                continue
            next_sweep = time.monotonic() + every
            try:
                recover(database_url(), self.stall_seconds)
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
