"""The calls of a step that was played but not recorded, counted in its run's usage all
the same: they were made, and paid for. A copy of the turn's message recorded it first,
its conversation was ended meanwhile, or the store kept refusing the step for longer
than its patience (`refused_for_now`; store/sql/db.py `reconnecting`)."""

from __future__ import annotations

from collections.abc import Iterable

from agenttest_worker.driver.run_cache import pricing_config
from agenttest_worker.engine.outcome import usage_by_role
from agenttest_worker.results import TurnResult
from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import ConversationStore


def count_unrecorded(
    store: ConversationStore, loaded: steps.LoadedCase, turns: Iterable[TurnResult]
) -> None:
    """Add the calls of `turns` (played, not recorded) to the run's usage and totals."""
    calls = (call for turn in turns for call in turn.calls or ())
    unrecorded = usage_by_role(calls, pricing_config(loaded))
    if unrecorded:
        store.add_unrecorded_usage(loaded.run_id, unrecorded)


def refused_for_now(exc: BaseException) -> bool:
    """Whether `exc` is the database refusing a write for now (db.is_transient)."""
    # Imported here, not above: an embedded run's first steps must not wait for
    # SQLAlchemy's import (see driver/step.py `saved_or_refused`).
    from sqlalchemy.exc import DBAPIError

    from agenttest_worker.store.sql.db import is_transient

    return isinstance(exc, DBAPIError) and is_transient(exc)
