"""An event loop per worker thread, kept for the thread's life, for agent calls.

Celery runs turn tasks on pool threads; agent calls are coroutines. Each pool thread
runs its task's coroutines on a loop of its own, reused from task to task together
with that loop's aiohttp connections. Handing every call to one shared I/O thread
instead cost a cross-thread wake-up and a GIL hand-off per call, which on a busy
worker doubled the CPU spent per turn (benchmarks/throughput.py). Loops belong to
the thread and the process that made them, so a forked child makes its own.

`new_event_loop` makes the loops a worker plays turns on, here and in the fleet's loop
pool: uvloop's where it is installed (AGENTTEST_EVENT_LOOP). A fleet turn's Python is
spread thin over the loop's machinery (a select per wake-up, a handle per callback, the
transports of its agent connections, a future per store call handed back from a
thread): on uvloop, which does those in C, a worker spent a median 9% less CPU per
turn (benchmarks/throughput.py, nine pairs alternating; benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from agenttest_worker.agents.http.exchange import close_session
from agenttest_worker.errors import ConfigError
from agenttest_worker.settings import EventLoopChoice, get_settings

T = TypeVar("T")

_local = threading.local()
_all_lock = threading.Lock()
_all: list[asyncio.AbstractEventLoop] = []


def new_event_loop(choice: EventLoopChoice | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop of the kind `choice` names (default: AGENTTEST_EVENT_LOOP):
    uvloop's, asyncio's own, or uvloop's where it is installed ('auto')."""
    if choice is None:
        choice = get_settings().event_loop
    if choice == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "AGENTTEST_EVENT_LOOP=uvloop, but uvloop is not installed here "
                "(pip install uvloop; it does not run on Windows)"
            ) from None
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def get_loop() -> asyncio.AbstractEventLoop:
    """This thread's loop (made on first use in this thread and process)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed() or getattr(_local, "pid", None) != os.getpid():
        loop = new_event_loop()
        _local.loop, _local.pid = loop, os.getpid()
        with _all_lock:
            _all.append(loop)
    return loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run `coro` to completion on this thread's loop."""
    loop = get_loop()
    if timeout is not None:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    return loop.run_until_complete(coro)


def shutdown() -> None:
    """Close this process's loops and their HTTP sessions (worker shutdown).

    A loop can only run on its own thread: loops of other threads are closed only when
    idle, which is the case once the pool has stopped.
    """
    with _all_lock:
        loops, _all[:] = list(_all), []
    for loop in loops:
        if loop.is_closed() or loop.is_running():
            continue
        try:
            loop.run_until_complete(close_session())
        except Exception:
            pass  # best effort: the process is ending anyway
        finally:
            loop.close()
