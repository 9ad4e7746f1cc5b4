"""A turn cut short by the run's --deadline (driver/step.py `cut_at`): told apart from a
timeout of the turn's own by the timeout itself, not by the wall clock. A loop's timer
may fire a hair before the deadline by the wall clock (uvloop's, to the millisecond);
the turn then raised out of its task and its conversation stayed pending. A loop whose
clock runs fast, firing every timer early, stands in for that loop here."""

from __future__ import annotations

import asyncio
import time

import pytest

from agenttest_worker.driver.step import cut_at


class FastClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs twice as fast as the wall clock: its timers fire
    early by the wall clock, as a coarse timer's sometimes do."""

    def __init__(self) -> None:
        super().__init__()
        self._origin = time.monotonic()

    def time(self) -> float:
        return self._origin + 2 * (time.monotonic() - self._origin)


def _run(coro: object) -> object:
    loop = FastClockLoop()
    try:
        return loop.run_until_complete(coro)  # type: ignore[arg-type]
    finally:
        loop.close()


def test_a_deadline_whose_timer_fires_early_cuts_the_work_instead_of_raising() -> None:
    async def ticking() -> None:  # (the loop wakes often, and sees its timers due)
        while True:
            await asyncio.sleep(0.005)

    async def cut() -> tuple[object, float]:
        ticker = asyncio.ensure_future(ticking())
        try:
            deadline_at = time.time() + 0.4
            outcome = await cut_at(deadline_at, asyncio.sleep(30, "finished"))
            return outcome, deadline_at - time.time()
        finally:
            ticker.cancel()

    outcome, left = _run(cut())  # type: ignore[misc]
    assert outcome is None, "cut by the deadline"
    assert left > 0.05, "the timer fired before the deadline by the wall clock"


def test_the_works_own_timeout_is_raised_and_its_result_returned() -> None:
    async def own_timeout() -> None:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(30)

    with pytest.raises(TimeoutError):
        _run(cut_at(time.time() + 30, own_timeout()))
    assert _run(cut_at(time.time() + 30, asyncio.sleep(0.01, "finished"))) == "finished"
