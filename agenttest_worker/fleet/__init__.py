"""The fleet: the Celery app and its configuration, the thin tasks, publishing them, the
loop pool that plays turns as coroutines, and the sweeper that recovers stalled
conversations. The aggregation the last conversation's task runs is the report
package's (report/aggregation.py).

Names are exported lazily: a process that never talks to a broker (an embedded run, a
dry run) does not pay for importing Celery.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttest_worker.fleet.cancel_command import broadcast_cancel
    from agenttest_worker.fleet.celery_app import app, sweep_interval
    from agenttest_worker.fleet.enqueue import (
        enqueue_aggregate,
        enqueue_start,
        enqueue_starts,
        enqueue_turn,
        enqueue_turns,
        follow_up,
    )
    from agenttest_worker.fleet.store_refusals import store_refusal
    from agenttest_worker.fleet.sweeper import recover

_EXPORTS = {
    "broadcast_cancel": "agenttest_worker.fleet.cancel_command",
    "app": "agenttest_worker.fleet.celery_app",
    "sweep_interval": "agenttest_worker.fleet.celery_app",
    "enqueue_aggregate": "agenttest_worker.fleet.enqueue",
    "enqueue_start": "agenttest_worker.fleet.enqueue",
    "enqueue_turn": "agenttest_worker.fleet.enqueue",
    "enqueue_starts": "agenttest_worker.fleet.enqueue",
    "enqueue_turns": "agenttest_worker.fleet.enqueue",
    "follow_up": "agenttest_worker.fleet.enqueue",
    "recover": "agenttest_worker.fleet.sweeper",
    "store_refusal": "agenttest_worker.fleet.store_refusals",
}

__all__ = [
    "app",
    "broadcast_cancel",
    "enqueue_aggregate",
    "enqueue_start",
    "enqueue_starts",
    "enqueue_turn",
    "enqueue_turns",
    "follow_up",
    "recover",
    "store_refusal",
    "sweep_interval",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
