"""Progress of a run on stderr: a live line on a terminal, a line per tenth in CI logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, label: str = "cases") -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.label = label
        self.live = self.stream.isatty()
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_tenth = 0

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def set(self, passed: int, failed: int, skipped: int) -> None:
        self.counts = {"passed": passed, "failed": failed, "skipped": skipped}
        self.draw()

    def case_done(self, status: str | None) -> None:
        if status in self.counts:
            self.counts[status] += 1
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
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def pause(self) -> None:
        """Clear the live line before something else is written (a prompt)."""
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
