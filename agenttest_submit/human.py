"""Asking the person at the terminal when an agent awaits input (--interactive)."""

from __future__ import annotations

import asyncio
import select
import sys
import threading

from agenttest_submit.progress import Progress
from agenttest_worker.durations import format_duration


def _read_line(timeout: float) -> str | None:
    """A line from stdin, or None on timeout or end of input."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return None
    line = sys.stdin.readline()
    if not line:
        return None
    return line.rstrip("\n")


class TerminalAsker:
    """One question at a time, even with many conversations waiting."""

    def __init__(self, progress: Progress | None = None) -> None:
        self._lock = threading.Lock()
        self.progress = progress

    def ask_blocking(
        self, case_id: str, question: str | None, hint: str | None, timeout: float
    ) -> tuple[str | None, str | None]:
        """(reply, None) or (None, why there is no reply)."""
        with self._lock:
            if self.progress:
                self.progress.pause()
            out = sys.stderr
            out.write(f"\n► [{case_id}] the agent is waiting for input\n")
            if question:
                out.write(f"  Agent: {question}\n")
            if hint:
                out.write(f"  Hint: {hint}\n")
            out.write(f"  Your reply (empty line or {format_duration(timeout)} to skip): ")
            out.flush()
            reply = _read_line(timeout)
            if reply is None:
                out.write("\n")
                return (
                    None,
                    f"Agent awaiting input, no interactive reply within {format_duration(timeout)}",
                )
            if not reply.strip():
                return None, "Agent awaiting input, the person at the terminal skipped it"
            return reply, None

    async def ask(
        self, case_id: str, question: str | None, hint: str | None, timeout: float
    ) -> tuple[str | None, str | None]:
        return await asyncio.to_thread(self.ask_blocking, case_id, question, hint, timeout)
