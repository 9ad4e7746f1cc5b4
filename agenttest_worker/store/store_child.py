"""The store's process itself: the calls its parent sends, run in order (store_process.py
is the parent's side and says why a run's store work runs in a process of its own).

Started afresh (`python -m agenttest_worker.store.store_child`, `main`) or forked
(`forked_child_starts`, then `serve_parent`): either way it imports the modules it is
told to, serves until its parent closes the pipe, runs its own atexit handlers (the
SQLite store's last close folds its write-ahead log back into one file) and leaves
without the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import signal
import struct
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import IO, Any, NoReturn

# The settings (pydantic's) are imported where they are read: the submitter forks a
# fleet run's store process before it imports them (fleet_storing.py).

# Between the modules a child imports first and those it imports after its first call.
LATER = "--later"
# Each request's length, before it.
FRAME = struct.Struct("!Q")


class StoreProcessError(RuntimeError):
    """The store's process ended, or raised what could not be sent back whole."""


class StoreInterrupted(Exception):
    """The parent stopped the call (`StoreProcess.interrupt`): raised in the store's
    process where the call stood, an Exception so that it comes back as the call's
    error instead of ending the process with a traceback."""


def _reply(value: Any, ok: bool) -> bytes:
    """The reply's bytes: the exception itself if it crosses whole, else its text."""
    try:
        data = pickle.dumps((ok, value), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # an exception that pickles may still not unpickle
        return data
    except Exception:
        if ok:
            value = StoreProcessError(f"the store's result could not be sent: {type(value)}")
        else:
            value = StoreProcessError(f"{type(value).__name__}: {value}")
        return pickle.dumps((False, value), protocol=pickle.HIGHEST_PROTOCOL)


def _read_frame(stream: IO[bytes]) -> bytes | None:
    """The next request's bytes, or None at the end of the stream (or a request cut short)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    body = stream.read(size)
    return body if len(body) == size else None


def serve(requests: IO[bytes], replies: IO[bytes], later: Sequence[str] = ()) -> None:
    """Run each call read from `requests`, its reply to `replies`, until end of input;
    import the modules `later` names once the first reply is out."""
    answered = 0
    while True:
        request = _read_frame(requests)
        if request is None:
            return  # the parent is done, or left (killed) in the middle of a request
        try:
            fn, args, kwargs = pickle.loads(request)
        except Exception as exc:  # what the request names cannot be imported here
            replies.write(_reply(exc, False))
            replies.flush()
            continue
        try:
            reply = _reply(fn(*args, **kwargs), True)
        except Exception as exc:
            from agenttest_worker.settings import get_settings  # see the top

            if get_settings().debug:
                traceback.print_exc()
            reply = _reply(exc, False)
        replies.write(reply)
        replies.flush()
        _run_after_reply()
        answered += 1
        if answered == 1:
            for name in later:
                importlib.import_module(name)


# Work the calls left to run once their reply is out (`after_reply`).
_after_reply: list[Callable[[], None]] = []


def after_reply(work: Callable[[], None]) -> bool:
    """In a store's process, run `work` once the current call's reply is out: the parent
    goes on meanwhile, and a call it sends waits for `work` in the pipe. Elsewhere (the
    store's work in the caller's own process) `work` is not run: False. For work that
    only saves a later call time; an error in it is dropped (printed with
    AGENTTEST_DEBUG)."""
    if _serving:
        _after_reply.append(work)
    return _serving


def _run_after_reply() -> None:
    while _after_reply:
        work = _after_reply.pop(0)
        try:
            work()
        except Exception:
            from agenttest_worker.settings import get_settings  # see the top

            if get_settings().debug:
                traceback.print_exc()


# Set in a store's process (main): its calls were sent by a parent.
_serving = False
# How often a call that stops with its parent looks for it.
PARENT_CHECK_SECONDS = 0.02


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise StoreInterrupted("stopped by the submitter")


@contextlib.contextmanager
def stopping_with_the_parent() -> Iterator[None]:
    """In a store's process, while inside: SIGTERM (`StoreProcess.interrupt`) raises
    StoreInterrupted where the call stands, so that its cleanup runs as it would in
    the parent interrupted; and a parent that dies (SIGKILL, the out-of-memory killer)
    ends this process at once, as the work would have ended with it, cleanup and all.
    Elsewhere (the work in the caller's own process), nothing changes."""
    if not _serving:
        yield
        return
    parent = os.getppid()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(PARENT_CHECK_SECONDS):
            if os.getppid() != parent:
                os._exit(1)

    watcher = threading.Thread(target=watch, name="agenttest-parent-watch", daemon=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    watcher.start()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        done.set()


def serve_forked(
    requests: int, replies: int, preload: Sequence[str], later: Sequence[str]
) -> NoReturn:
    """A forked store's process, on the pipes' descriptors: it serves, then leaves
    (it never returns into its parent's code)."""
    try:
        _shed_the_parents()
        serve_parent(os.fdopen(requests, "rb"), os.fdopen(replies, "wb"), preload, later)
        _leave()
    except BaseException:
        # What a started one's interpreter would say before it ended.
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(1)


def _shed_the_parents() -> None:
    """What a forked store's process holds of its parent's that is not its own: the
    parent's atexit handlers (run at the parent's exit, not this one's: a temporary
    folder of the parent's must not be removed when the store's work is done) and its
    SIGTERM handler (`interrupt` ends this process unless a call stops where it stands,
    `stopping_with_the_parent`). And what its work prints goes to stderr, as a started
    one's does, never into the report on the parent's stdout."""
    atexit._clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no stdout or stderr
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def serve_parent(
    requests: IO[bytes], replies: IO[bytes], preload: Sequence[str], later: Sequence[str]
) -> None:
    """A store's process, started (main) or forked: import `preload`, then serve."""
    global _serving
    _serving = True
    # Ctrl-C reaches the whole foreground process group: the parent handles it (its
    # cleanup flushes through this process), so it must not end this one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in preload:
        importlib.import_module(name)
    serve(requests, replies, later)


def main() -> None:
    # The replies go out on the original stdout; anything the work prints goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    names = sys.argv[1:]
    split = names.index(LATER) if LATER in names else len(names)
    serve_parent(sys.stdin.buffer, replies, names[:split], names[split + 1 :])
    _leave()


def _leave() -> NoReturn:
    """What the interpreter's teardown would do that matters (this process's atexit
    handlers: the SQLite store's last close folds its write-ahead log back into one
    file), then leave: freeing SQLAlchemy and the rest one object at a time took ~0.1 s
    that the parent, waiting for this process to close the database, would wait for too."""
    atexit._run_exitfuncs()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # By the module's own name, not as __main__: the exceptions it sends back must be
    # this module's classes for the parent to read them.
    from agenttest_worker.store.store_child import main as serve_calls

    serve_calls()
