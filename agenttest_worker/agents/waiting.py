"""Turns waiting for an agent: for a rate-limit slot (ratelimit.py) or out a retry's
back-off (transport.py, a 429's Retry-After).

A wait can last longer than the broker's visibility timeout or the stall sweeper's
period; the turn is not lost, only patient. So a waiting turn is listed in WAITING from
the moment it has to wait until it goes on, and on a fleet the worker marks the turns
listed there alive (fleet/liveness.py). Which turn a call belongs to is the caller's
to say (`current_turn`, a context variable, so the coroutines a task runs inherit it);
the agents layer never looks inside it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class WaitingTurns:
    """The turns of this process now waiting for an agent, with when each began.

    What a turn is, is the caller's (`current_turn`): the fleet's turn task sets it, and
    an embedded run, which has neither a visibility timeout nor a sweeper, sets nothing.
    Only a wait that actually happens is listed (a slot free at once lists nothing), so
    the hot path pays nothing for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[object, tuple[float, int]] = {}

    def begin(self, turn: object) -> None:
        with self._lock:
            since, holds = self._since.get(turn, (time.monotonic(), 0))
            self._since[turn] = (since, holds + 1)

    def end(self, turn: object) -> None:
        with self._lock:
            since, holds = self._since.pop(turn, (0.0, 1))
            if holds > 1:
                self._since[turn] = (since, holds - 1)

    def waiting_since(self, before: float) -> list[object]:
        """The turns that began waiting before `before` (time.monotonic) and still wait."""
        with self._lock:
            return [turn for turn, (since, _) in self._since.items() if since <= before]

    @contextmanager
    def holding(self, turn: object | None) -> Iterator[None]:
        if turn is None:
            yield
            return
        self.begin(turn)
        try:
            yield
        finally:
            self.end(turn)


WAITING = WaitingTurns()
_current_turn: ContextVar[object | None] = ContextVar("agenttest_current_turn", default=None)


@contextmanager
def current_turn(turn: object) -> Iterator[None]:
    """Calls made inside (on this thread, and in the coroutines it runs) wait as `turn`."""
    token = _current_turn.set(turn)
    try:
        yield
    finally:
        _current_turn.reset(token)


@contextmanager
def waiting() -> Iterator[None]:
    """While inside, the current turn (if any) is listed in WAITING."""
    with WAITING.holding(_current_turn.get()):
        yield


class Waits:
    """An acquire's wait: listed in WAITING from its first sleep to its end."""

    def __init__(self) -> None:
        self.turn: object | None = None

    async def sleep(self, seconds: float) -> None:
        if self.turn is None and (turn := _current_turn.get()) is not None:
            self.turn = turn
            WAITING.begin(turn)
        await asyncio.sleep(seconds)

    def done(self) -> None:
        if self.turn is not None:
            WAITING.end(self.turn)
            self.turn = None
