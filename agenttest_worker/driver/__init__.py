"""The conversation driver: plays a conversation's steps over a store.

One code path serves the embedded runner and the Celery turn task: `step` loads a
conversation, runs one engine step, and saves it with the guarded idempotent save;
`budget` counts a run's tokens and cost; `rejudge` judges a stored conversation again;
`event_loops` gives each worker thread its own event loop for agent calls.

Names are exported lazily: importing the package does not import the store.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Advance": "agenttest_worker.driver.step",
    "PoolCache": "agenttest_worker.driver.step",
    "answer_human": "agenttest_worker.driver.step",
    "run_step": "agenttest_worker.driver.step",
    "run_step_sync": "agenttest_worker.driver.step",
    "budget_spent": "agenttest_worker.driver.budget",
    "reevaluate": "agenttest_worker.driver.rejudge",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
