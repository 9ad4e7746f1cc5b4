"""An embedded run's lanes (agenttest_submit/run/embedded.py): started one at a time, so that
the first calls reach their agent while the later lanes start, and cancelled together."""

from __future__ import annotations

import asyncio

import pytest

from agenttest_submit.run.embedded import _started_one_by_one


def test_a_lane_goes_on_to_its_call_before_the_next_lanes_start() -> None:
    """Each lane gets as far as its first call (here: a connection completing on the next
    turn of the loop) before the lane after the next one starts; all of them end."""
    events: list[tuple[str, int]] = []
    number = iter(range(5))

    async def lane() -> None:
        mine = next(number)
        events.append(("start", mine))
        await asyncio.sleep(0)  # the connection completes on the loop's next turn
        events.append(("call", mine))
        await asyncio.sleep(0.01)  # the agent answers

    async def main() -> None:
        work = await _started_one_by_one(lane, 5)
        await work

    asyncio.run(main())
    assert sorted(events) == sorted([(e, n) for n in range(5) for e in ("start", "call")])
    for mine in range(3):
        assert events.index(("call", mine)) < events.index(("start", mine + 2)), events


def test_cancelled_while_starting_the_lanes_started_end_first() -> None:
    """Stopped (Ctrl-C, SIGTERM, a deadline) before every lane started: the lanes started
    are cancelled and have ended when the cancellation reaches the caller, whose last
    write then finds none of them still running."""
    ended: list[int] = []
    number = iter(range(100))

    async def lane() -> None:
        mine = next(number)
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.01)  # its own cleanup takes a while
            ended.append(mine)

    async def main() -> None:
        starting = asyncio.ensure_future(_started_one_by_one(lane, 100))
        for _ in range(3):
            await asyncio.sleep(0)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert ended and sorted(ended) == list(range(len(ended))) and len(ended) < 100

    asyncio.run(main())
