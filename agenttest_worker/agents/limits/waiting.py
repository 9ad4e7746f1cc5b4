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
import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token


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

    def holding(self, turn: object | None) -> Holding:
        """While inside, `turn` (if any) is listed as waiting."""
        return Holding(self, turn)


class Holding:
    """`WaitingTurns.holding`. A class, not a generator: a fleet's turn keeps one for as
    long as it runs (entered only if it has to wait), thousands at once against a slow
    agent, and a generator's context manager with its frame was ~600 bytes of each."""

    __slots__ = ("_turn", "_turns")

    def __init__(self, turns: WaitingTurns, turn: object | None) -> None:
        self._turns = turns
        self._turn = turn

    def __enter__(self) -> None:
        if self._turn is not None:
            self._turns.begin(self._turn)

    def __exit__(self, *exc: object) -> None:
        if self._turn is not None:
            self._turns.end(self._turn)


WAITING = WaitingTurns()
_current_turn: ContextVar[object | None] = ContextVar("agenttest_current_turn", default=None)


def current_turn(turn: object) -> CurrentTurn:
    """Calls made inside (on this thread, and in the coroutines it runs) wait as `turn`."""
    return CurrentTurn(turn)


class CurrentTurn:
    """`current_turn` (a class for the reason `Holding` is one)."""

    __slots__ = ("_token", "_turn")

    def __init__(self, turn: object) -> None:
        self._turn = turn
        self._token: Token[object | None] | None = None

    def __enter__(self) -> None:
        self._token = _current_turn.set(self._turn)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current_turn.reset(self._token)
            self._token = None


@contextmanager
def waiting() -> Iterator[None]:
    """While inside, the current turn (if any) is listed in WAITING."""
    with WAITING.holding(_current_turn.get()):
        yield


class Waits:
    """An acquire's wait: listed in WAITING from its first sleep to its end."""

    def __init__(self) -> None:
        self.turn: object | None = None

    def begin(self) -> None:
        """From now on the wait is listed (a call about to wait its turn in line)."""
        if self.turn is None and (turn := _current_turn.get()) is not None:
            self.turn = turn
            WAITING.begin(turn)

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep `seconds`, or until `wake` is set (a slot freed in this process)."""
        self.begin()
        if wake is None:
            await asyncio.sleep(seconds)
            return
        wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()

    def done(self) -> None:
        if self.turn is not None:
            WAITING.end(self.turn)
            self.turn = None
