"""Thin Celery tasks: load state, call the engine, save, enqueue the next turn.

`agenttest.turn(run_id, case_id, turn)` runs one turn of one conversation; the task
that ends a run's last conversation enqueues `agenttest.aggregate(run_id)`. Task
names and arguments are plain ids, so Flower shows what is running and no secret ever
travels through the broker.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_process_init, worker_process_shutdown

from agenttest_worker.aggregate import aggregate
from agenttest_worker.celery_app import app
from agenttest_worker.conversation import Advance, PoolCache, run_step_sync
from agenttest_worker.settings import get_settings
from agenttest_worker.store.db import upgrade

log = logging.getLogger("agenttest.tasks")
_pools = PoolCache()


def _url() -> str:
    url = get_settings().effective_database_url()
    upgrade(url)  # a no-op after the first call in this process
    return url


@worker_process_init.connect
def _migrate_on_start(**_: Any) -> None:
    _url()


@worker_process_shutdown.connect
def _close_io(**_: Any) -> None:
    from agenttest_worker.runtime import shutdown

    shutdown()


def follow_up(run_id: str, case_id: str, advance: Advance) -> None:
    """Enqueue what the step asked for: the next turn, the aggregation."""
    if advance.next_turn is not None:
        turn.apply_async((run_id, case_id, advance.next_turn))
    if advance.run_finished:
        aggregate_run.apply_async((run_id,))


@app.task(name="agenttest.turn")
def turn(run_id: str, case_id: str, turn: int) -> str:
    advance = run_step_sync(
        _url(), _pools, run_id, case_id, turn, max_deliveries=get_settings().max_redeliveries
    )
    follow_up(run_id, case_id, advance)
    if not advance.saved:
        return f"{case_id} turn {turn}: already recorded"
    if advance.case_done:
        return f"{case_id} turn {turn}: case {advance.status}"
    if advance.awaiting_human:
        return f"{case_id} turn {turn}: waiting for a person"
    return f"{case_id} turn {turn}: next turn {advance.next_turn}"


@app.task(name="agenttest.aggregate")
def aggregate_run(run_id: str) -> str:
    done = aggregate(_url(), run_id)
    return f"{run_id}: aggregated" if done else f"{run_id}: already aggregated"
