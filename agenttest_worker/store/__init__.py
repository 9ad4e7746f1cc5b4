"""The store: where runs, conversations, turns and reports live (SQLite embedded,
PostgreSQL on a fleet), with SQLAlchemy models and Alembic migrations.

Two sides behind one face:

- `sql/`: the database, one module per subject (runs, turns, results, recovery, run
  history, usage, budgets), the tables and the migrations;
- `memory/`: the embedded runner's `BufferedStore`, one run in memory, written to the
  database in batches.

Beside them: `base` (`ConversationStore`, all a conversation step needs from storage,
and `SqlStore`, which goes to the database on every step: the workers' store), `steps`
(what a step loads and saves, as plain data), `reservations` (budget reservations),
`kept_states` (states a worker keeps between its steps), `storable` (JSON without NUL).

`open_store(url)` picks the store by the URL's scheme from `STORES`, an alias table
as Celery's result backends have. Names are exported lazily: SQLAlchemy is imported
when a store is first used, not by a dry run or the engine's users.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttest_worker.store.conversation_store import ConversationStore, SqlStore
    from agenttest_worker.store.memory.buffered import BufferedStore
    from agenttest_worker.store.sql import (
        judge_labels,
        pruning,
        recovery,
        run_history,
        runs,
        usage,
    )
    from agenttest_worker.store.sql import run_results as results
    from agenttest_worker.store.sql.agent_spans import StoredSpans
    from agenttest_worker.store.sql.db import (
        error_reason,
        is_connection_lost,
        is_sqlite,
        is_transient,
        session_scope,
        upgrade,
    )
    from agenttest_worker.store.sql.judge_labels import UnstableCriterion, unstable_criteria
    from agenttest_worker.store.sql.models import CaseRow, RunRow
    from agenttest_worker.store.sql.stored_conversations import (
        StoredConversation,
        stored_conversations,
    )
    from agenttest_worker.store.sql.usage import add_run_usage, usage_document
    from agenttest_worker.store.steps import (
        CaseRecord,
        CaseText,
        LoadedCase,
        Step,
        StoredCase,
        as_object,
        new_run_id,
    )

# Which store a database URL opens, by its scheme (the part before "://", without a
# "+driver"): "module:Class".
STORES = {
    "sqlite": "agenttest_worker.store.conversation_store:SqlStore",
    "postgres": "agenttest_worker.store.conversation_store:SqlStore",
    "postgresql": "agenttest_worker.store.conversation_store:SqlStore",
}


def open_store(url: str) -> ConversationStore:
    """The store a database URL names; an unknown scheme says which ones are known."""
    scheme = url.partition("://")[0].partition("+")[0].lower()
    if scheme not in STORES:
        known = ", ".join(f"{name}://" for name in sorted(STORES))
        raise ValueError(f"a store URL starts with one of {known}, not {scheme}://")
    module, _, name = STORES[scheme].partition(":")
    store: ConversationStore = getattr(import_module(module), name)(url)
    return store


_SQL = "agenttest_worker.store.sql"
_EXPORTS = {
    "ConversationStore": "agenttest_worker.store.conversation_store",
    "SqlStore": "agenttest_worker.store.conversation_store",
    "BufferedStore": "agenttest_worker.store.memory.buffered",
    "error_reason": f"{_SQL}.db",
    "is_connection_lost": f"{_SQL}.db",
    "is_transient": f"{_SQL}.db",
    "is_sqlite": f"{_SQL}.db",
    "session_scope": f"{_SQL}.db",
    "upgrade": f"{_SQL}.db",
    "CaseRow": f"{_SQL}.models",
    "UnstableCriterion": f"{_SQL}.judge_labels",
    "unstable_criteria": f"{_SQL}.judge_labels",
    "RunRow": f"{_SQL}.models",
    "StoredConversation": f"{_SQL}.stored_conversations",
    "stored_conversations": f"{_SQL}.stored_conversations",
    "add_run_usage": f"{_SQL}.usage",
    "reply_cache_at": f"{_SQL}.cached_replies",
    "StoredSpans": f"{_SQL}.agent_spans",
    "usage_document": f"{_SQL}.usage",
    "CaseRecord": "agenttest_worker.store.steps",
    "CaseText": "agenttest_worker.store.steps",
    "LoadedCase": "agenttest_worker.store.steps",
    "Step": "agenttest_worker.store.steps",
    "StoredCase": "agenttest_worker.store.steps",
    "as_object": "agenttest_worker.store.steps",
    "new_run_id": "agenttest_worker.store.steps",
}
# Subjects exported whole, as namespaces (`store.runs.get_run(...)`), by module.
_SUBJECTS = {
    "judge_labels": "judge_labels",
    "pruning": "pruning",
    "recovery": "recovery",
    "reply_cache": "cached_replies",
    "results": "run_results",
    "run_history": "run_history",
    "runs": "runs",
    "usage": "usage",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in _SUBJECTS:
        return import_module(f"{_SQL}.{_SUBJECTS[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STORES",
    "BufferedStore",
    "CaseRecord",
    "CaseRow",
    "CaseText",
    "ConversationStore",
    "LoadedCase",
    "RunRow",
    "SqlStore",
    "Step",
    "StoredCase",
    "StoredConversation",
    "StoredSpans",
    "UnstableCriterion",
    "add_run_usage",
    "as_object",
    "error_reason",
    "is_connection_lost",
    "is_sqlite",
    "is_transient",
    "judge_labels",
    "new_run_id",
    "open_store",
    "pruning",
    "recovery",
    "reply_cache",
    "reply_cache_at",
    "results",
    "run_history",
    "runs",
    "session_scope",
    "stored_conversations",
    "unstable_criteria",
    "upgrade",
    "usage",
    "usage_document",
]
