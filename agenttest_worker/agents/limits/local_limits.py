"""What one process keeps of an agent's rate limits (agents/limits/ratelimit.py's LocalLimiter):
its request window, tokens, calls in flight, pause and probe, and the limit learned from
the agent's 429s (AIMD); and what both limiters share: the line a process's waiting
calls stand in, and how a learned limit is announced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from agenttest_worker.observe import metrics

log = logging.getLogger("agenttest.ratelimit")


class Line:
    """The calls of one process waiting for an agent's slot: one at a time asks (the
    others wait their turn, in order, without polling), and a slot freed in this process
    wakes it at once."""

    __slots__ = ("lock", "wake")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.wake = asyncio.Event()


def learned_changed(agent: str, limit: int, before: int) -> None:
    """The learned limit of `agent` is now `limit` (was `before`; 0: none)."""
    metrics.learned_concurrency(agent, limit)
    if limit and (before == 0 or limit < before):  # (each step up is not worth a line)
        log.info("rate limit: %s answered 429; calls in flight now at most %d", agent, limit)


class LocalState:
    def __init__(self) -> None:
        # After a pause: "open" until a probe goes, then the probe's lease until it answers.
        self.probe: object | None = None
        # One [stamp] cell per admitted call, restamped when its response arrives.
        self.starts: list[list[float]] = []
        self.tokens: deque[tuple[float, int]] = deque()
        self.active = 0
        self.paused_until = 0.0
        self.line = Line()
        # The learned limit (adaptive limits only): 0 until the first 429; its halvings
        # so far; the successes counted towards the next step up.
        self.learned = 0
        self.epoch = 0
        self.successes = 0
        self.cap = 0  # the provider's request limit, when it states one

    def answered(self, agent: str, epoch: int, status: int | None) -> None:
        """AIMD on a learned limit, from one answer (`active` still counts its call)."""
        if status == 429:
            if self.learned and epoch != self.epoch:
                return  # sent before the last halving: that window has halved already
            before = self.learned
            self.learned = max(1, (self.learned or self.active) // 2)
            if self.cap:
                self.learned = min(self.learned, self.cap)
            self.epoch += 1
            self.successes = 0
            learned_changed(agent, self.learned, before)
        elif self.learned and status is not None and 200 <= status < 300:
            self.successes += 1
            if self.successes >= self.learned:
                self.successes = 0
                room = not self.cap or self.learned < self.cap
                if room and self.active >= self.learned:  # the window was in use: one more
                    self.learned += 1
                    metrics.learned_concurrency(agent, self.learned)


class LocalLease:
    def __init__(
        self,
        state: LocalState,
        counted: bool,
        start: list[float] | None,
        agent: str = "",
        adaptive: bool = False,
    ) -> None:
        self.state = state
        self.counted = counted
        self.start = start
        self.agent = agent
        self.adaptive = adaptive
        self.epoch = state.epoch

    async def release(self, tokens: int, status: int | None = None) -> None:
        state = self.state
        if state.probe is self and status != 429:
            state.probe = None
        if self.adaptive:
            state.answered(self.agent, self.epoch, status)
        if self.start is not None:
            self.start[0] = time.monotonic()
        if self.counted:
            state.active -= 1
            state.line.wake.set()
        if tokens:
            state.tokens.append((time.monotonic(), tokens))
