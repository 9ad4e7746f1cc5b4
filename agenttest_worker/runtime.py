"""One event loop per worker process, on its own thread, for every agent call.

Celery runs tasks on pool threads (or processes); agent calls are coroutines that
share one aiohttp connection pool. A task hands its coroutine to this loop and waits,
so database work stays on the task's thread and HTTP work on the loop. The loop is
created lazily and per process (after a fork, the child makes its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def _start_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    threading.Thread(target=run, name="agenttest-io", daemon=True).start()
    ready.wait()
    return loop


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            _loop = _start_loop()
            _loop_pid = os.getpid()
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run `coro` on the process's I/O loop and wait for its result."""
    future = asyncio.run_coroutine_threadsafe(coro, get_loop())
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


def shutdown() -> None:
    """Close the loop's HTTP session and stop the loop (worker shutdown)."""
    global _loop
    with _lock:
        loop = _loop
        _loop = None
    if loop is None or loop.is_closed() or _loop_pid != os.getpid():
        return
    from agenttest_worker.agents.transport import close_session

    with contextlib.suppress(Exception):  # best effort: the process is ending anyway
        asyncio.run_coroutine_threadsafe(close_session(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
