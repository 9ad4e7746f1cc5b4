"""benchmarks/profile_shares.py: each sampled stack of a loop-pool worker is counted
where its time went, not under the event loop every turn runs beneath."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.profile_shares import shares

LOOP = (
    "Thread.run (threading.py:982);TaskPool._run_loop (agenttest_worker/fleet/loop_pool.py:181);"
    "BaseEventLoop.run_forever (asyncio/base_events.py:607);"
    "BaseEventLoop._run_once (asyncio/base_events.py:1922)"
)


def _line(*frames: str, count: int = 1) -> str:
    return ";".join((LOOP, *frames)) + f" {count}"


def test_a_turn_on_the_loop_counts_as_the_turn_and_the_bare_loop_as_the_loop() -> None:
    lines = [
        _line(
            "Handle._run (asyncio/events.py:80)",
            "_play_on_loop (agenttest_worker/fleet/tasks.py:131)",
            "run_turn (agenttest_worker/engine/turn.py:289)",
            count=3,
        ),
        _line("EpollSelector.select (selectors.py:468)", count=2),
        _line(
            "Handle._run (asyncio/events.py:80)",
            "TaskPool._begin (agenttest_worker/fleet/loop_pool.py:250)",
            "fast_trace_task (celery/app/trace.py:651)",
        ),
        _line(
            "Handle._run (asyncio/events.py:80)",
            "_post_json (agenttest_worker/agents/transport.py:253)",
            "ClientSession._request (aiohttp/client.py:900)",
            count=4,
        ),
        "not a stack line",
    ]
    counts, total = shares(lines)
    assert total == 10
    assert counts == {
        "turn: engine, assertions, models, task body": 3,
        "event loop machinery (the pool's loop: select, callbacks)": 2,
        "Celery: task handling": 1,
        "agent call: aiohttp": 4,
    }
