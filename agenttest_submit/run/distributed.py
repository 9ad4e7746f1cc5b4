"""Runs on a worker fleet: store the run in the shared database, enqueue, watch, report.

With AGENTTEST_BROKER_URL set, the submitter stores the run and its cases in
AGENTTEST_DATABASE_URL (Postgres), publishes one `agenttest.turn(run, case, 1)` per
conversation through one broker connection, prints the run id, and (with --wait, the
default) shows progress read from the database until the aggregator has built the
report (fleet_watch.py); then it prints the report, writes -o, and exits 0/1.

The run's conversations start as it is stored: `FleetStarter` publishes one
`agenttest.start` per batch of cases as soon as the batch is stored (storing.py). What
watching needs is imported once the fleet is already playing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from agenttest_submit.cli.request import RunRequest
from agenttest_submit.cli.stopping import Terminated, interrupted_exit_code, interrupted_word
from agenttest_submit.run.output import emit_report
from agenttest_worker.agents import ProjectConfig
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.settings import get_settings

# The publishing of tasks (agenttest_worker.fleet.enqueue, through Celery) is imported
# where it is used, not here: import_publisher_meanwhile
# imports it on a thread while the run is stored. The tasks themselves (fleet.tasks) are
# the workers' alone.


def database_url() -> str:
    settings = get_settings()
    if not settings.database_url:
        raise InputError(
            InputProblem(
                "AGENTTEST_BROKER_URL is set but AGENTTEST_DATABASE_URL is not: workers and "
                "the submitter must share one database (postgresql://...)"
            )
        )
    return settings.database_url


def import_publisher_meanwhile() -> None:
    """Import what publishes tasks on a thread while the run is being stored.

    It is imported before the first conversation can start; storing the run is mostly
    waiting on the database, time Celery's import can use.
    `FleetStarter` (or `enqueue_run`) then finds it imported (or waits on the import
    lock until it is).
    """

    def load() -> None:
        # On failure enqueue_run imports them again and reports the error where it belongs.
        with contextlib.suppress(BaseException):
            from agenttest_worker.fleet import enqueue_starts  # noqa: F401

    threading.Thread(target=load, name="agenttest-import", daemon=True).start()


def enqueue_run(run_id: str, total: int) -> None:
    """Start every conversation of a stored run: one `agenttest.start` per batch of cases,
    published together.

    Workers expand each batch into turn tasks (only for conversations not yet started),
    so the submitter's cost does not grow with one publish per case.
    """
    # The publisher: see the note at the top.
    from agenttest_worker.fleet import enqueue_starts

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
        from agenttest_worker.fleet import enqueue_start  # the publisher: see the top

        enqueue_start(run_id, first, last)

    def started(self, run_id: str, every_case_ended: bool) -> None:
        # The publisher: see the note at the top.
        from agenttest_worker.fleet import enqueue_aggregate, enqueue_starts

        if every_case_ended:  # they ended before the run was running: nobody else will
            enqueue_aggregate(run_id)
        elif self.parallel is not None:
            from agenttest_worker.store import runs  # the store: where it is used

            starts = runs.claim_starts(self.url, run_id, self.parallel)
            if starts is not None:
                enqueue_starts(run_id, *starts)


def run_distributed(
    request: RunRequest,
    url: str,
    run_id: str,
    total: int,
    config: ProjectConfig,
    options: RunOptions,
) -> int:
    """Watch a run whose conversations were started as it was stored (unless --no-wait)."""
    print(f"run {run_id}: {total} case(s) enqueued", file=sys.stderr, flush=True)
    if not request.wait:
        # The run id alone on stdout, everything else on stderr: RUN=$(agenttest-submit
        # ... --no-wait) is the id.
        print(run_id, flush=True)
        print(
            f"follow it with: agenttest-submit status {run_id}; "
            f"report with: agenttest-submit report {run_id}",
            file=sys.stderr,
        )
        if request.baseline:
            # Nothing is compared before the run ends: the diff is for later.
            print(
                f"--baseline/--fail-on: with --no-wait nothing is compared; once the run is "
                f"done: agenttest-submit diff {run_id}",
                file=sys.stderr,
            )
        return 0
    try:
        # Watching (the store's reads, SQLAlchemy, agents for a person's answers) is
        # imported only now, the run's first conversations under way on the fleet; a
        # Ctrl-C or SIGTERM during the import stops the watching like any other.
        from agenttest_submit.run.fleet_watch import wait_for_run

        wait_for_run(url, run_id, total, config, options, {})
    except KeyboardInterrupt as exc:
        print(
            f"\n{interrupted_word(exc)}: stopped watching; run {run_id} goes on on the "
            f"workers (agenttest-submit status {run_id})",
            file=sys.stderr,
            flush=True,
        )
        if not isinstance(exc, Terminated):
            offer_cancel(url, run_id)
        return interrupted_exit_code(exc)
    return emit_report(url, run_id, request)


# How long a second Ctrl-C after the first cancels the run rather than doing nothing.
SECOND_CTRL_C_SECONDS = 5.0


def offer_cancel(url: str, run_id: str) -> None:
    """After a first Ctrl-C: a second one within SECOND_CTRL_C_SECONDS cancels the run on
    the fleet, as `agenttest-submit cancel RUN` does; else the run goes on."""
    print(
        f"press Ctrl-C again within {SECOND_CTRL_C_SECONDS:g} s to cancel run {run_id} "
        f"(later: agenttest-submit cancel {run_id})",
        file=sys.stderr,
        flush=True,
    )
    try:
        time.sleep(SECOND_CTRL_C_SECONDS)
        return
    except KeyboardInterrupt as again:
        if isinstance(again, Terminated):
            return
    from agenttest_submit.commands.cancel import cancel_everywhere  # the store: only here
    from agenttest_worker.store import runs  # the store: only here

    reason = f"cancelled by {runs.submitted_by()} (Ctrl-C twice)"
    cancel_everywhere(url, run_id, reason)
    print(f"run {run_id}: cancelled ({reason})", file=sys.stderr, flush=True)
