"""Storing a fleet's run, and starting its conversations as its batches are stored.

`FleetStarter` publishes one `agenttest.start` per stored batch. Where the storing runs:
a run submitted from the command line is stored by a store's process
(store/store_process.py) that the console script forks first thing (early_store.py).
Its imports (the settings, psycopg, and redis-py to publish: ~0.2 s of CPU, a seventh
of a small run's time on a fleet) then run on the other core while the submitter
imports, parses and checks the cases; once they are all checked, it stores the run
from the spool's file (`write_spooled_run`) and starts it. The submitter's own process
imports neither psycopg nor redis-py for it.

A Ctrl-C or SIGTERM stops that storing as it stops the storing in the submitter's own
process (the run removed: `store_spooled`), and a submitter killed outright takes the
store's process with it, leaving the run half stored as it would have
(`stopping_with_the_parent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agenttest_submit.spool_records import spooled_records
from agenttest_submit.storing import NewRun, RunStarter, write_run

if TYPE_CHECKING:
    from agenttest_worker.store.store_process import StoreWork


def enqueue_run(run_id: str, total: int) -> None:
    """Start every conversation of a stored run: one `agenttest.start` per batch of cases,
    published together.

    Workers expand each batch into turn tasks (only for conversations not yet started),
    so the submitter's cost does not grow with one publish per case.
    """
    # The publisher: see the note at the top.
    from agenttest_worker.fleet.enqueue import enqueue_starts

    if total:
        enqueue_starts(run_id, 0, total - 1)


class FleetStarter:
    """Starts a run's conversations on the fleet batch by batch, as they are stored.

    One `agenttest.start` per stored batch (as `enqueue_run` publishes for a run stored
    beforehand): on a large run the fleet works on the first conversations while the
    rest are written, instead of waiting for all of them.

    With `parallel` (--parallel given), at most that many conversations of the run are
    under way at once across the fleet: none starts while the run is stored; once it is
    running, the first `parallel` are claimed and started here, and each conversation
    that ends claims the next in the write that ends it (runs.claim_starts).
    """

    def __init__(self, url: str, parallel: int | None = None) -> None:
        self.url = url
        self.parallel = parallel

    def stored(self, run_id: str, first: int, last: int) -> None:
        if self.parallel is not None:
            return  # started once the run is running, `parallel` at a time
        from agenttest_worker.fleet.enqueue import enqueue_start  # the publisher: see the top

        enqueue_start(run_id, first, last)

    def started(self, run_id: str, every_case_ended: bool) -> None:
        # The publisher: see the note at the top.
        from agenttest_worker.fleet.enqueue import enqueue_aggregate, enqueue_starts

        if every_case_ended:  # they ended before the run was running: nobody else will
            enqueue_aggregate(run_id)
        elif self.parallel is not None:
            from agenttest_worker.store import runs  # SQLAlchemy: only for --parallel

            starts = runs.claim_starts(self.url, run_id, self.parallel)
            if starts is not None:
                enqueue_starts(run_id, *starts)


@dataclass(frozen=True)
class FromSpool:
    """Where a run's records are stored from: the store's process `work`, reading the
    spool's file at `path`."""

    work: StoreWork
    path: str


@dataclass(frozen=True)
class SpooledRun:
    """A run to store from the spool's file, its batches started by `starter`."""

    url: str
    spool: str
    run: NewRun
    starter: RunStarter | None


def store_spooled(work: StoreWork, run: SpooledRun) -> int:
    """Store `run` in `work`'s process (`write_spooled_run`); the cases stored. Stopped
    here (Ctrl-C, SIGTERM), the storing there is stopped too, and the run removed."""
    try:
        return work.call(write_spooled_run, run)
    except KeyboardInterrupt:
        work.interrupt()
        raise


def write_spooled_run(run: SpooledRun) -> int:
    """In the store's process: store the run from the spool's file and start it."""
    from agenttest_worker.store.store_child import stopping_with_the_parent

    with stopping_with_the_parent(), open(run.spool, "rb") as handle:
        return write_run(run.url, run.run, spooled_records(handle), run.starter)
