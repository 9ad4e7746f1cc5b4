"""A step played but not recorded still counts its calls in the run's usage.

Two copies of one turn's message may play the same step at once (a redelivered copy
while the first still runs, a duplicate publish): one records it, and the other's save
is refused. Its calls were made and paid for all the same: they go to the run's usage
outside its conversations' records (`runs.usage`), which every report adds to the
records' own. Shown here on each store a step is saved to, against the demo agents:
the worker's (Postgres, and SQLite) and the embedded runner's in-memory one. The same
on a real fleet: tests/test_usage_by_role_fleet.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_run_store import fresh_suite, stored_suite

from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
from agenttest_worker.driver.step import Advance, PoolCache
from agenttest_worker.results import RoleUsage
from agenttest_worker.settings import get_settings
from agenttest_worker.store.conversation_store import ConversationStore, SqlStore
from agenttest_worker.store.sql import runs, usage


def _played(store: ConversationStore, run_id: str, case_id: str, copies: int) -> list[Advance]:
    """`copies` copies of a conversation's first turn played at once on `store`."""

    async def all_of_them() -> list[Advance]:
        from agenttest_worker.agents.http.exchange import close_session

        pools = PoolCache()
        try:
            at = TurnAddress(run_id, case_id, 1, None)
            plays = (run_step(store, pools, at, inline) for _ in range(copies))
            return list(await asyncio.gather(*plays))
        finally:
            await close_session()

    return asyncio.run(all_of_them())


def _sql_store() -> tuple[str, str, Any, Callable[[], None]]:
    db, run_id = stored_suite()
    return db, run_id, SqlStore(db), lambda: None


def _buffered_store() -> tuple[str, str, Any, Callable[[], None]]:
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run())
    return db, run_id, store, store.flush


@pytest.mark.parametrize("kind", ["worker-postgres", "worker-sqlite", "embedded"])
def test_the_copy_that_did_not_record_a_step_counts_its_calls_in_the_run(
    demo: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if kind == "worker-postgres":
        monkeypatch.setenv("AGENTTEST_DATABASE_URL", pg_database)
        get_settings.cache_clear()
    make = _buffered_store if kind == "embedded" else _sql_store
    db, run_id, store, flush = make()

    advances = _played(store, run_id, "T001", 2)
    flush()
    assert sorted(a.saved for a in advances) == [False, True]
    # Both copies sent the same requests to the deterministic demo agents: the calls
    # the run did not record are exactly those it recorded.
    recorded = usage.calls_by_agent(db, run_id)
    assert [(c.role, c.calls) for c in recorded] == [("target", 1)]
    run = runs.get_run(db, run_id)
    assert run is not None
    assert usage.stored_usage(run.usage) == {
        "target": RoleUsage(
            calls=1,
            prompt_tokens=recorded[0].prompt_tokens,
            completion_tokens=recorded[0].completion_tokens,
            total_tokens=recorded[0].total_tokens,
            cost=0.0,
        )
    }
    assert recorded[0].total_tokens > 0
    # And in the run's totals, which its budget counts (the recorded turn's tokens join
    # them when its case ends: T001 has turns left).
    assert run.total_tokens == recorded[0].total_tokens

    # A step recorded once by a single copy adds nothing there.
    [again] = _played(store, run_id, "T002", 1)
    flush()
    assert again.saved
    run = runs.get_run(db, run_id)
    assert run is not None and set(usage.stored_usage(run.usage)) == {"target"}
    assert usage.stored_usage(run.usage)["target"].calls == 1


def test_calls_that_cannot_be_counted_are_a_warning_not_a_failed_turn(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The step was recorded by the other copy: a database gone meanwhile loses only
    # the count of this copy's calls, and says so.
    gone = pg_database.rsplit("/", 1)[0] + "/no_such_database_here"
    used = {"target": RoleUsage(calls=1, prompt_tokens=3, completion_tokens=2, total_tokens=5)}
    SqlStore(gone).add_unrecorded_usage("r1", used)
    warned = [r.getMessage() for r in caplog.records if r.name == "agenttest.store"]
    assert len(warned) == 1 and "could not count the calls of a turn of run r1" in warned[0]
    assert "no_such_database_here" in warned[0]
