"""Asking the person at the terminal when an agent awaits input (--interactive).

One question at a time, even with many conversations waiting: what the agent said (its
reply, and the question of an awaiting tool call such as `ask_user`), its `input_hint`,
then the reply line. No reply within the case's `interactive.timeout`, an empty line, or
the end of the terminal's input (Ctrl-D) means "no reply": the conversation's
`on_missing_input` decides, with the reason saying which it was. `human_question` reads
what to ask, and how long to wait, from a parked conversation. What the agent said and
the case id are printed with control characters escaped (report.common.printable), and
the progress line is held while the prompt is up, so that neither writes over it.
"""

from __future__ import annotations

import asyncio
import codecs
import io
import os
import select
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from agenttest_submit.run.progress import Progress
from agenttest_worker.agents import DEFAULT_AWAITING_TOOLS
from agenttest_worker.durations import format_duration
from agenttest_worker.report import asked_question, printable
from agenttest_worker.results import TurnResult
from agenttest_worker.store import LoadedCase, as_object

# Lines of what the agent said after the first sit under it, past "  Agent: ".
_CONTINUED = "\n" + " " * len("  Agent: ")


class _Lines:
    """Lines from stdin's file descriptor, with a timeout per line.

    Reading the descriptor (not `sys.stdin`, whose buffer `select` cannot see) keeps a
    second line typed or pasted ahead in our own buffer, for the next question.
    """

    def __init__(self) -> None:
        self.buffer = ""
        self.eof = False
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self, timeout: float) -> str | None:
        """A line without its end, or None on timeout or at the end of input."""
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, ValueError, io.UnsupportedOperation):
            line = sys.stdin.readline()  # not a real file (embedded use): no timeout
            return line.rstrip("\r\n") if line else None
        deadline = time.monotonic() + timeout
        while "\n" not in self.buffer:
            if self.eof:
                return None
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                return None
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal went away
                chunk = b""
            if not chunk:
                self.eof = True
                if self.buffer:  # a last line without a newline still counts
                    line, self.buffer = self.buffer, ""
                    return line.rstrip("\r")
                return None
            self.buffer += self.decoder.decode(chunk)
        line, self.buffer = self.buffer.split("\n", 1)
        return line.rstrip("\r")


class TerminalAsker:
    """One question at a time, even with many conversations waiting."""

    def __init__(self, progress: Progress | None = None) -> None:
        self._lock = threading.Lock()
        self._lines = _Lines()
        self.progress = progress

    def ask_blocking(
        self, case_id: str, question: str | None, hint: str | None, timeout: float
    ) -> tuple[str | None, str | None]:
        """(reply, None) or (None, why there is no reply)."""
        with self._lock, self._terminal():
            if self._lines.eof:
                return None, "Agent awaiting input, the terminal's input has ended"
            out = sys.stderr
            out.write(f"\n► [{printable(case_id)}] the agent is waiting for input\n")
            if question and question.strip():
                said = printable(question.strip(), keep_lines=True)
                out.write(f"  Agent: {_CONTINUED.join(said.splitlines())}\n")
            if hint and hint.strip():
                out.write(f"  Hint: {printable(' '.join(hint.split()))}\n")
            out.write(f"  Your reply (empty line or {format_duration(timeout)} to skip): ")
            out.flush()
            reply = self._lines.read(timeout)
            if reply is None:
                out.write("\n")
                out.flush()
                if self._lines.eof:
                    return None, "Agent awaiting input, the terminal's input has ended"
                return (
                    None,
                    f"Agent awaiting input, no interactive reply within {format_duration(timeout)}",
                )
            if not reply.strip():
                return None, "Agent awaiting input, the person at the terminal skipped it"
            return reply, None

    @contextmanager
    def _terminal(self) -> Iterator[None]:
        """The terminal to ourselves: no progress line drawn until the prompt is done."""
        with self.progress.held() if self.progress else nullcontext():
            yield

    async def ask(
        self, case_id: str, question: str | None, hint: str | None, timeout: float
    ) -> tuple[str | None, str | None]:
        return await asyncio.to_thread(self.ask_blocking, case_id, question, hint, timeout)


@dataclass(frozen=True)
class HumanQuestion:
    # What the agent said to ask: its reply, and the question of an awaiting tool call
    # when the reply does not hold it (None: it said nothing).
    question: str | None
    hint: str | None
    timeout: float


def human_question(
    loaded: LoadedCase, timeouts: Mapping[str, float] | None = None
) -> HumanQuestion:
    """What to ask a person about a conversation parked for one: the engine's prompt,
    and how long to wait (`timeouts` for this case, else the stored case's
    interactive.timeout in seconds, else the spec's default: 5m)."""
    state = as_object(loaded.state) or {}
    prompt = state.get("prompt") or {}
    timeout = (timeouts or {}).get(loaded.case_id)
    if not timeout:
        interactive = (as_object(loaded.case) or {}).get("interactive")
        stored = interactive.get("timeout") if isinstance(interactive, dict) else None
        timeout = float(stored) if isinstance(stored, int | float) else 300.0
    return HumanQuestion(_what_was_said(state, loaded.run_options), prompt.get("hint"), timeout)


def _what_was_said(state: Mapping[str, object], run_options: Mapping[str, object]) -> str | None:
    """The agent's last reply, and below it the question an awaiting tool call asked
    (ask_user(question=...)) when the reply does not already say it."""
    turns = state.get("turns")
    last = turns[-1] if isinstance(turns, list) and turns else None
    if not isinstance(last, dict):
        prompt = state.get("prompt")
        question = prompt.get("question") if isinstance(prompt, dict) else None
        return question if isinstance(question, str) else None
    turn = TurnResult.model_validate(last)
    configured = run_options.get("awaiting_tools")
    tools = configured if isinstance(configured, list) else list(DEFAULT_AWAITING_TOOLS)
    reply = (turn.output or "").strip()
    asked = asked_question(turn, [str(name) for name in tools])
    if asked and asked not in reply:
        return f"{reply}\n{asked}" if reply else asked
    return reply or None
