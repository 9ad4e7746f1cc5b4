"""agenttest worker: everything that runs a conversation.

`celery -A agenttest_worker worker` finds the Celery app through the `celery` attribute,
which is resolved lazily so that importing the case model does not import Celery.
"""

from __future__ import annotations

from typing import Any

__all__ = ["celery"]


def __getattr__(name: str) -> Any:
    if name in ("celery", "app"):
        from agenttest_worker.fleet.celery_app import app

        return app
    raise AttributeError(name)
