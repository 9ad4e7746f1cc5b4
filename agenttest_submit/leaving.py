"""The `agenttest-submit` console script: the command, then leaving at once.

Before anything else is imported, a fleet run's store process is forked
(early_store.py): its imports then run on the other core while this process's run.

Once a command is done, CPython's finalization frees, one by one, everything the process
imported and built (pydantic's schemas, SQLAlchemy, aiohttp, the run's records): about
0.1 s of a 1,000-case embedded run (`benchmarks/embedded.py`), work nobody needs. So
the console script, after `cli.main` returns, does what finalization would do that
matters (the atexit handlers: logging's flush, the SQLite store's last close, which
folds its write-ahead log back into one file; stdout and stderr flushed) and leaves with
`os._exit`, keeping the exit code.

It leaves the normal way instead when something could still need the interpreter: a
thread that is not a daemon still running (CPython would wait for it), or stdout or
stderr that cannot be flushed (CPython reports that itself). `cli.main` stays a plain
function returning the code, for callers inside a process of their own.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

__all__ = ["leave", "main"]


def main() -> NoReturn:
    """The console script's entry point."""
    # First thing: a fleet run's store process, forked before the rest is imported.
    from agenttest_submit.early_store import fleet_store_process

    work = fleet_store_process(sys.argv[1:])
    from agenttest_submit.cli import main as command

    leave(command(store_work=work))


def leave(code: int) -> NoReturn:
    """Exit with `code`, skipping the interpreter's teardown when nothing needs it."""
    if _threads_still_running():
        sys.exit(code)
    atexit._run_exitfuncs()  # each handler's error is printed by CPython, not raised
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: let CPython say so
        sys.exit(code)
    os._exit(code)


def _threads_still_running() -> bool:
    main_thread = threading.main_thread()
    return any(
        thread is not main_thread and thread.is_alive() and not thread.daemon
        for thread in threading.enumerate()
    )
