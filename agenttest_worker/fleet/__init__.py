"""The fleet: the Celery app and its configuration, the thin tasks, the sweeper that
recovers stalled conversations, and the aggregation that builds a run's reports once
its last conversation ends.

Names are exported lazily: importing a module of this package for a helper does not
start Celery's import (~0.3 s) in processes that never talk to a broker.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "app": "agenttest_worker.fleet.app",
    "build_report": "agenttest_worker.report.aggregate",
    "enqueue_start": "agenttest_worker.fleet.enqueue",
    "enqueue_turn": "agenttest_worker.fleet.enqueue",
    "recover": "agenttest_worker.fleet.sweeper",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
