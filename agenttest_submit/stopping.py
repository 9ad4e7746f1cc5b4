"""SIGTERM stops the submitter the way Ctrl-C does.

A CI job that is cancelled or times out, `timeout(1)` and a stopped container send
SIGTERM, whose default action ends the process where it stands. Raised as an exception
instead, it unwinds through the same cleanup as Ctrl-C: a run still being stored is
removed (the conversations already started find it gone and stop), an embedded run
writes the turns it holds in memory (so `resume` goes on from there instead of
playing them again), and a submitter that was waiting leaves the run to the workers.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; every `except KeyboardInterrupt` handles it as Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` in the main thread (signal handlers can
    only be set there; elsewhere, nothing changes). The previous handler comes back
    after, so a process that calls the CLI in-process keeps its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def interrupted_word(exc: KeyboardInterrupt) -> str:
    return "terminated" if isinstance(exc, Terminated) else "interrupted"
