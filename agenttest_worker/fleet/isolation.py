"""Redelivered turns run alone in their worker, so that only a turn that kills its
worker is ever blamed for it.

A turn whose worker dies (a segfault in an agent's script, the out-of-memory killer)
comes back from the broker flagged as redelivered, and after AGENTTEST_MAX_REDELIVERIES
such deaths its case fails: a turn that kills every worker running it must not keep
the run from finishing. But a worker runs many turns at once (threads), and all of
them come back when it dies: counted against each, one bad turn failed the innocent
conversations that happened to share its worker (2-9 per run in a fault campaign).

So a redelivered turn waits until the turns running in its worker process have
finished, runs with no other turn beside it (new ones wait meanwhile), and only then is
its delivery counted (driver/step.py, `count_delivery`). A death while a turn ran alone
is that turn's doing; a death while it ran beside others is nobody's in particular and
counts against no one. An innocent turn therefore finishes at its first redelivery
(its save resets the count), while the guilty one is failed after running alone
AGENTTEST_MAX_REDELIVERIES times (plus its first, shared, delivery).

The price is paid only after a crash: a worker runs the turns it gets back one at a
time until each has finished once. First deliveries, the hot path, take a shared hold
here (a lock acquired and released, no I/O). A redelivered turn waiting to run alone
is marked alive meanwhile (liveness.py), so the broker does not hand it to yet another
worker while it waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext

from agenttest_worker.observe import metrics


class _Holds:
    """Who holds the process, and the rule both isolations follow: a readers-writer
    lock that prefers the writer. Once a redelivered turn waits to run alone, new turns
    wait behind it, so a busy worker cannot keep it waiting for ever."""

    def __init__(self) -> None:
        self._shared = 0
        self._alone = False
        self._waiting_alone = 0

    def _must_wait_to_share(self) -> bool:
        return self._alone or bool(self._waiting_alone)

    def _must_wait_to_be_alone(self) -> bool:
        return self._alone or bool(self._shared)

    def _last_shared_left(self) -> bool:
        """A redelivered turn waits, and no shared turn is left to keep it waiting."""
        return not self._shared and bool(self._waiting_alone)


class Isolation(_Holds):
    """A turn either shares the process with other turns or has it to itself (Celery's
    thread pool: turns on threads of one process)."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition()

    @contextmanager
    def shared(self, while_waiting: AbstractContextManager[object] | None = None) -> Iterator[None]:
        """Run beside other turns (a first delivery); `while_waiting` is entered only if
        it has to wait (a redelivered turn runs alone), for as long as it waits."""
        with self._changed:
            if self._must_wait_to_share():
                with while_waiting or nullcontext():
                    while self._must_wait_to_share():
                        self._changed.wait()
            self._shared += 1
        try:
            with metrics.playing():
                yield
        finally:
            with self._changed:
                self._shared -= 1
                if self._last_shared_left():
                    self._changed.notify_all()

    @contextmanager
    def alone(self, while_waiting: AbstractContextManager[object] | None = None) -> Iterator[None]:
        """Run with no other turn in this process (a redelivered turn); `while_waiting`
        is entered for as long as it waits for that."""
        metrics.redelivered()  # only a redelivered turn runs alone
        with while_waiting or nullcontext(), self._changed:
            self._waiting_alone += 1
            try:
                while self._must_wait_to_be_alone():
                    self._changed.wait()
            finally:
                self._waiting_alone -= 1
            self._alone = True
        try:
            with metrics.playing():
                yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


class LoopIsolation(_Holds):
    """`Isolation` for turns played as coroutines on one event loop (loop_pool.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        # Made on the loop that uses it (the pool's), at its first turn.
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def shared(self, while_waiting: AbstractContextManager[object] | None = None) -> LoopShare:
        """Run beside other turns (a first delivery), as `Isolation.shared`."""
        return LoopShare(self, while_waiting)

    async def _begin_shared(self, while_waiting: AbstractContextManager[object] | None) -> None:
        if self._must_wait_to_share():
            changed = self._condition()
            with while_waiting or nullcontext():
                async with changed:
                    await changed.wait_for(lambda: not self._must_wait_to_share())
        self._shared += 1

    async def _end_shared(self) -> None:
        self._shared -= 1
        if self._last_shared_left():
            changed = self._condition()
            async with changed:
                changed.notify_all()

    @asynccontextmanager
    async def alone(
        self, while_waiting: AbstractContextManager[object] | None = None
    ) -> AsyncIterator[None]:
        metrics.redelivered()
        changed = self._condition()
        with while_waiting or nullcontext():
            self._waiting_alone += 1
            try:
                async with changed:
                    await changed.wait_for(lambda: not self._must_wait_to_be_alone())
            finally:
                self._waiting_alone -= 1
            self._alone = True
        try:
            with metrics.playing():
                yield
        finally:
            self._alone = False
            async with changed:
                changed.notify_all()


class LoopShare:
    """`LoopIsolation.shared`. A class, not an async generator: every turn on the loop
    holds one for as long as it runs, thousands at once against a slow agent, and a
    generator's context manager with its frame was ~700 bytes of each."""

    __slots__ = ("_isolation", "_playing", "_while_waiting")

    def __init__(
        self, isolation: LoopIsolation, while_waiting: AbstractContextManager[object] | None
    ) -> None:
        self._isolation = isolation
        self._while_waiting = while_waiting
        self._playing = metrics.playing()

    async def __aenter__(self) -> None:
        # (Cancelled while it waits to share, it never counted as sharing: no exit.)
        await self._isolation._begin_shared(self._while_waiting)
        self._playing.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        try:
            self._playing.__exit__(*exc)
        finally:
            await self._isolation._end_shared()


# The process's turns: Celery's thread pool runs them all in one process (TURNS), or
# the loop pool on its one event loop (LOOP_TURNS).
TURNS = Isolation()
LOOP_TURNS = LoopIsolation()
