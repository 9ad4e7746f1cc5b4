"""A fleet run's store process, forked first thing (fleet_storing.py says why).

Decided from the command line's words and the environment alone, before the CLI and
the settings are imported: the child then imports psycopg, redis-py and the settings
on the other core while this process imports the rest and checks the cases. One forked
for what turns out to be no run (a subcommand, help, settings that are wrong) is ended
unused. Forking needs a process with no other thread, which this is at that point.
"""

from __future__ import annotations

import os
import threading

from agenttest_worker.store.store_process import StoreWork, child_wanted, forked_store_process

# Words after which no run is stored.
_NOT_A_RUN = frozenset({"--dry-run", "--reeval", "-h", "--help", "--version"})

# What the store's process imports before the run reaches it: the store, publishing
# through redis-py (fleet/enqueue.py).
PRELOAD = (
    "agenttest_submit.fleet_storing",
    "agenttest_worker.store.runs",
    "agenttest_worker.fleet.enqueue",
)


def looks_like_a_run(args: list[str]) -> bool:
    """Whether the command line's words may store a new run: a run's start with an
    option (a subcommand's with its name), and none says it stops short of one."""
    return bool(args) and args[0].startswith("-") and not any(arg in _NOT_A_RUN for arg in args)


def fleet_store_process(args: list[str]) -> StoreWork | None:
    """The store's process for the fleet run `args` look like, forked now, or None."""
    if os.name != "posix" or not os.environ.get("AGENTTEST_BROKER_URL"):
        return None
    if not looks_like_a_run(args):
        return None
    if not child_wanted(os.environ.get("AGENTTEST_STORE_PROCESS", "auto").strip().lower()):
        return None
    if threading.active_count() > 1:
        return None  # (a program calling the console script in-process)
    return forked_store_process(PRELOAD)
