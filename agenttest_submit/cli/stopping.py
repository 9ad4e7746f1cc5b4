"""SIGTERM stops the submitter the way Ctrl-C does.

A CI job that is cancelled or times out, `timeout(1)` and a stopped container send
SIGTERM, whose default action ends the process where it stands. Raised as an exception
instead, it unwinds through the same cleanup as Ctrl-C: a run still being stored is
removed (the conversations already started find it gone and stop), an embedded run
writes the turns it holds in memory (so `resume` goes on from there instead of
playing them again), and a submitter that was waiting leaves the run to the workers.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

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


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, SIGTERM cancelling `main` and raising `Terminated` once it
    has unwound (as asyncio itself does for Ctrl-C).

    Raised by the signal handler, `Terminated` landed in whichever task the main thread
    was running: that task kept it as its own exception too, and asyncio printed it at
    exit as "Task exception was never retrieved", with a traceback. Here the signal
    only cancels the run; its cleanup (`finally` blocks) runs as for an interrupt.
    """
    return asyncio.run(_cancelled_by_sigterm(main))


async def _cancelled_by_sigterm(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    previous = signal.getsignal(signal.SIGTERM)
    terminated = False

    def on_sigterm() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (RuntimeError, ValueError, NotImplementedError):
        return await main  # not the main thread, or no such support: nothing changes
    try:
        return await main
    except asyncio.CancelledError:
        if terminated:
            raise Terminated() from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        # asyncio leaves the default action behind; the run's next steps still need
        # SIGTERM to unwind through their own cleanup.
        signal.signal(signal.SIGTERM, previous)
