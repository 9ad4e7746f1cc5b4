"""Runs cancelled while their turns are played: each turn in flight is cut short.

A cancelled run's next steps end its conversations skipped (step.stop_reason reads the
run's `cancelled` when each step loads), but a turn already playing would otherwise go
on calling its agents and be recorded after the cancel. So every turn played on an
event loop (loop_step.run_step) waits on its agents inside a timeout of no duration,
registered here under its run; `cancel(run_id)`, called from any thread (a worker's
remote-control command, the embedded runner's watch on its run row), expires those
timeouts on their own loops. The step then loads its conversation again and, its run
now cancelled, ends it skipped with the run's reason: nothing the cut turn did is kept
(the state it changed in place is dropped, and the stored one read again).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

_Entry = tuple[asyncio.AbstractEventLoop, asyncio.Timeout]


class RunCancels:
    """The turns in flight in this process, by run, and the cut of a run's turns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turns: dict[str, set[_Entry]] = {}

    def runs_in_flight(self) -> set[str]:
        with self._lock:
            return set(self._turns)

    async def unless_cancelled(self, run_id: str, work: Awaitable[T]) -> T | None:
        """`work`'s result, or None when `cancel(run_id)` came first (`work` cancelled).

        In this task, not a new one (as step.cut_at): a timeout of its own, expired by
        `cancel`; a TimeoutError that is not its own is raised."""
        timeout = asyncio.timeout(None)
        entry = (asyncio.get_running_loop(), timeout)
        try:
            async with timeout:
                with self._lock:
                    self._turns.setdefault(run_id, set()).add(entry)
                try:
                    return await work
                finally:
                    with self._lock:
                        turns = self._turns.get(run_id)
                        if turns is not None:
                            turns.discard(entry)
                            if not turns:
                                del self._turns[run_id]
        except TimeoutError:
            if not timeout.expired():
                raise
        return None

    def cancel(self, run_id: str) -> int:
        """Cut every turn of `run_id` in flight here; how many there were."""
        with self._lock:
            entries = list(self._turns.get(run_id, ()))
        for loop, timeout in entries:
            loop.call_soon_threadsafe(self._expire, run_id, loop, timeout)
        return len(entries)

    def _expire(
        self, run_id: str, loop: asyncio.AbstractEventLoop, timeout: asyncio.Timeout
    ) -> None:
        # On the turn's loop: only a turn still registered is still inside its timeout
        # (it unregisters on this same thread before leaving it).
        with self._lock:
            registered = (loop, timeout) in self._turns.get(run_id, ())
        if registered:
            timeout.reschedule(loop.time())


# The process's turns in flight (a worker's, or the embedded runner's).
RUN_CANCELS = RunCancels()
