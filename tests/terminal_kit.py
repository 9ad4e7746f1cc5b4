"""Ending a child process that runs on a pseudo-terminal, for the tests that need one."""

from __future__ import annotations

import os
import signal
import time


def reap(pid: int, fd: int, grace: float) -> int:
    """The exit code of the child `pid` once it has exited, within `grace` seconds; still
    running then, it hung: it is killed (the caller's checks then fail). The terminal's
    side `fd` is closed either way."""
    exit_by = time.monotonic() + grace
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done and time.monotonic() < exit_by:
        time.sleep(0.02)
        done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status)
