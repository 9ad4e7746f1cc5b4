"""Which process is running an embedded run: a lock held for as long as it drives it.

An embedded run has no workers: the process that drives its conversations is the only
one moving them, and `resume` in another process while it is alive would play each of
them a second time at once (its agents called twice). So the driver holds an exclusive
`flock` on a file named after the run under AGENTTEST_HOME, and `resume` asks whether
it is held. The kernel releases it when the driver dies, however it dies (SIGKILL
too), so a run whose driver is gone is resumed at once, with no stall period to wait
out. It sees processes on this machine only (with the same AGENTTEST_HOME); a fleet's
runs are judged by the stall period instead (resume.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from agenttest_worker.settings import get_settings


def _lock_file(run_id: str) -> Path:
    return get_settings().home / "running" / f"{run_id}.lock"


@contextlib.contextmanager
def driving(run_id: str) -> Iterator[None]:
    """Hold the run's lock while inside (best effort: a home that cannot be written
    leaves the run unlocked rather than failing it)."""
    path = _lock_file(run_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+", encoding="utf-8")
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            handle.truncate(0)
            handle.write(str(os.getpid()))
            handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        handle.close()


def driven_by(run_id: str) -> int | None:
    """The id of the live process on this machine driving the run, if one is."""
    try:
        handle = _lock_file(run_id).open("r", encoding="utf-8")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = handle.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
