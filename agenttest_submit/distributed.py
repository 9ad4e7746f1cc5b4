"""Runs on a worker fleet: store the run in the shared database, enqueue, watch, report.

With AGENTTEST_BROKER_URL set, the submitter stores the run and its cases in
AGENTTEST_DATABASE_URL (Postgres), publishes one `agenttest.turn(run, case, 1)` per
conversation through one broker connection, prints the run id, and (with --wait, the
default) shows progress read from the database until the aggregator has built the
report (fleet_watch.py); then it prints the report, writes -o, and exits 0/1.

On the way to the run's first conversation this module imports neither SQLAlchemy nor
the watch: on Postgres the run is stored through psycopg alone (storing.py), by the
store's process the console script forked where there is one (fleet_storing.py), and
what watching needs is imported once the fleet is already playing.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from agenttest_submit.output import emit_report
from agenttest_submit.request import RunRequest
from agenttest_submit.stopping import interrupted_exit_code, interrupted_word
from agenttest_worker.agents.config import ProjectConfig
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
    """Import what publishes tasks on a thread while the run is being stored (when this
    process stores it, not a store's process: fleet_storing.py).

    It is imported before the first conversation can start; storing the run is mostly
    waiting on the database, time the import can use (Celery's is ~0.2 s).
    `FleetStarter` (or `enqueue_run`, fleet_storing.py) then finds it imported (or
    waits on the import lock until it is).
    """

    def load() -> None:
        # On failure enqueue_run imports them again and reports the error where it belongs.
        with contextlib.suppress(BaseException):
            import agenttest_worker.fleet.enqueue  # noqa: F401

    threading.Thread(target=load, name="agenttest-import", daemon=True).start()


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
        from agenttest_submit.fleet_watch import wait_for_run

        wait_for_run(url, run_id, total, config, options, {})
    except KeyboardInterrupt as exc:
        print(
            f"\n{interrupted_word(exc)}: stopped watching; run {run_id} goes on on the "
            f"workers (agenttest-submit status {run_id})",
            file=sys.stderr,
        )
        return interrupted_exit_code(exc)
    return emit_report(url, run_id, request)
