"""Progress of a run on stderr: a live line on a terminal, a line per tenth in CI logs.

While a question is put to the person at the terminal (`held`), nothing is drawn: the
live line would be written over the prompt they are reading and typing after. Counts
still change meanwhile; the line comes back, up to date, once the prompt is answered.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from agenttest_submit.cli.terminal import redraws_in_place


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, label: str = "cases") -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.label = label
        # TERM=dumb knows neither "\r" nor erase-line: it gets the CI log's lines.
        self.live = redraws_in_place(self.stream)
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_tenth = 0
        # Conversations finish on the event loop while a prompt waits on another thread:
        # the lock keeps a draw from starting once the prompt has the terminal.
        self._lock = threading.RLock()
        self._held = 0

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def set(self, passed: int, failed: int, skipped: int) -> None:
        self.counts = {"passed": passed, "failed": failed, "skipped": skipped}
        self.draw()

    def case_done(self, status: str | None, count: int = 1) -> None:
        if status in self.counts:
            self.counts[status] += count
        self.draw()

    def take_back(self, status: str | None) -> None:
        """A case counted done with `status` is not done after all (its end was not
        stored)."""
        if status is not None and self.counts.get(status, 0) > 0:
            self.counts[status] -= 1

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "█" * filled + "░" * (width - filled)
        return (
            f"{bar} {self.done}/{self.total} {self.label} · {self.counts['passed']} passed · "
            f"{self.counts['failed']} failed · {self.counts['skipped']} skipped · {elapsed:.1f}s"
        )

    def draw(self, force: bool = False) -> None:
        with self._lock:
            if not self._held:
                self._draw(force)

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if self.live:
            if force or now - self._last_draw >= 0.1 or self.done == self.total:
                self.stream.write("\r\033[K" + self.line())
                self.stream.flush()
                self._last_draw = now
            return
        tenth = (10 * self.done // self.total) if self.total else 10
        if tenth > self._last_tenth or force:
            self._last_tenth = tenth
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        with self._lock:
            self._clear()

    def pause(self) -> None:
        """Clear the live line before something else is written (a message)."""
        with self._lock:
            self._clear()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Clear the live line and draw nothing until the block ends (a prompt is up)."""
        with self._lock:
            self._clear()
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
            self.draw(force=True)

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
