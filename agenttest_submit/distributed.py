"""Runs on a worker fleet: store the run in the shared database, enqueue, watch, report.

With AGENTTEST_BROKER_URL set, the submitter stores the run and its cases in
AGENTTEST_DATABASE_URL (Postgres), publishes one `agenttest.turn(run, case, 1)` per
conversation through one broker connection, prints the run id, and (with --wait, the
default) shows progress read from the database until the aggregator has built the
report; then it prints the report, writes -o, and exits 0/1. With --interactive and a
terminal, conversations parked for a person are answered from here and resumed on any
worker. While it waits, it also re-enqueues its run's conversations if the broker lost
their messages, and builds the reports if the aggregation was lost (the workers'
sweepers do the same for every run; see agenttest_worker.fleet.sweeper, "Recovering lost
messages"), and it keeps watching through a database restart.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from sqlalchemy.exc import DBAPIError

from agenttest_submit.human import TerminalAsker, human_question
from agenttest_submit.output import emit_report
from agenttest_submit.progress import Progress
from agenttest_submit.request import RunRequest
from agenttest_submit.stopping import interrupted_exit_code, interrupted_word, run_async
from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.exchange import close_session
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.driver.step import Advance, answer_human
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report.common import printable
from agenttest_worker.settings import get_settings
from agenttest_worker.store import results, runs
from agenttest_worker.store.base import ConversationStore, SqlStore
from agenttest_worker.store.db import error_reason, is_connection_lost

# Celery and the publishing of tasks (agenttest_worker.fleet.enqueue) are imported where
# they are used, not here: import_celery_meanwhile imports them on a thread while the
# run is stored. The tasks themselves (fleet.tasks) are the workers' alone.

POLL_SECONDS = 0.5


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


def import_celery_meanwhile() -> None:
    """Import Celery and what publishes tasks on a thread while the run is being stored.

    They take ~0.2 s to import, all of it before the first conversation can start;
    storing the run is mostly waiting on the database, time the import can use.
    `FleetStarter` (or `enqueue_run`) then finds them imported (or waits on the import
    lock until they are).
    """

    def load() -> None:
        # On failure enqueue_run imports them again and reports the error where it belongs.
        with contextlib.suppress(BaseException):
            import agenttest_worker.fleet.enqueue  # noqa: F401

    threading.Thread(target=load, name="agenttest-import", daemon=True).start()


def enqueue_run(run_id: str, total: int) -> None:
    """Start every conversation of a stored run: one `agenttest.start` per batch of cases,
    published together.

    Workers expand each batch into turn tasks (only for conversations not yet started),
    so the submitter's cost does not grow with one publish per case.
    """
    # Celery: see the note at the top.
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
        from agenttest_worker.fleet.enqueue import enqueue_start  # Celery: see the top

        enqueue_start(run_id, first, last)

    def started(self, run_id: str, every_case_ended: bool) -> None:
        # Celery: see the note at the top.
        from agenttest_worker.fleet.enqueue import enqueue_aggregate, enqueue_starts

        if every_case_ended:  # they ended before the run was running: nobody else will
            enqueue_aggregate(run_id)
        elif self.parallel is not None:
            starts = runs.claim_starts(self.url, run_id, self.parallel)
            if starts is not None:
                enqueue_starts(run_id, *starts)


def follow_up(run_id: str, case_id: str, advance: Advance) -> None:
    from agenttest_worker.fleet.enqueue import follow_up as enqueue  # Celery: see the top

    enqueue(run_id, case_id, advance)


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
        wait_for_run(url, run_id, total, config, options, {})
    except KeyboardInterrupt as exc:
        print(
            f"\n{interrupted_word(exc)}: stopped watching; run {run_id} goes on on the "
            f"workers (agenttest-submit status {run_id})",
            file=sys.stderr,
        )
        return interrupted_exit_code(exc)
    return emit_report(url, run_id, request)


def wait_for_run(
    url: str,
    run_id: str,
    total: int,
    config: ProjectConfig,
    options: RunOptions,
    human_timeouts: dict[str, float],
) -> None:
    """Progress from the database until the run's reports exist."""
    # Celery: see the note at the top.
    from agenttest_worker.fleet.app import sweep_interval
    from agenttest_worker.fleet.sweeper import recover

    stall = get_settings().stall_seconds
    next_sweep = time.monotonic() + sweep_interval(stall)
    # A run of repeated cases counts its conversations (each repetition is one).
    progress = Progress(total, label="cases" if options.distinct_cases is None else "conversations")
    ConsumerWatch(run_id, progress).start()
    asker = TerminalAsker(progress)
    pool = AgentPool(config)
    unreachable = False
    try:
        while True:
            # The database may restart while we wait (the workers ride it out too):
            # keep watching rather than die with the run still going on the fleet.
            try:
                run = runs.get_run(url, run_id)
                if run is not None and run.status != "done" and options.interactive is not False:
                    _answer_waiting(url, run_id, pool, asker, human_timeouts)
            except DBAPIError as exc:
                if not is_connection_lost(exc):
                    raise
                if not unreachable:
                    print(
                        f"the database is unreachable ({printable(error_reason(exc))}); "
                        f"still waiting for run {run_id}",
                        file=sys.stderr,
                        flush=True,
                    )
                    unreachable = True
                time.sleep(POLL_SECONDS)
                continue
            if unreachable:
                print("the database is back", file=sys.stderr, flush=True)
                unreachable = False
            if run is None:
                raise RuntimeError(f"run {run_id} disappeared from the database")
            progress.set(run.passed, run.failed, run.skipped)
            if run.status == "done":
                return
            if time.monotonic() >= next_sweep:
                try:
                    recover(url, stall, run_id)
                except Exception as exc:  # e.g. the broker is still down: try again later
                    # An exception's text may quote what it failed on: escaped.
                    print(
                        f"recovering lost messages failed: {printable(str(exc))}", file=sys.stderr
                    )
                next_sweep = time.monotonic() + sweep_interval(stall)
            time.sleep(POLL_SECONDS)
    finally:
        progress.close()


# How long the submitter waits before it looks for a worker consuming the queue, and
# between looks while it finds none: a worker started with the run is ready by then.
NO_WORKER_AFTER = 3.0
NO_WORKER_AGAIN = 10.0


class ConsumerWatch(threading.Thread):
    """Says on stderr when no worker consumes the run's queue (and again once one does).

    A run enqueued where no worker listens would otherwise wait in silence for ever. It
    asks the workers over the broker which queues they consume (Celery's remote control,
    which answers within a second), on a thread, so that watching the run goes on.
    """

    def __init__(self, run_id: str, progress: Progress) -> None:
        super().__init__(name="agenttest-consumers", daemon=True)
        self.run_id, self.progress = run_id, progress

    def run(self) -> None:
        queue = get_settings().queue
        time.sleep(NO_WORKER_AFTER)
        warned = False
        while True:
            try:
                consumed = _consumed_queues()
            except Exception:  # the broker is out of reach: the run's own watch says so
                consumed = None
            if consumed is not None and queue in consumed:
                if warned:
                    self._say(f"a worker is consuming `{queue}` now")
                return
            if not warned:
                self._say(
                    f"no worker is consuming `{queue}`: run {self.run_id} waits until one "
                    "does. Start one with the same AGENTTEST_BROKER_URL and "
                    "AGENTTEST_DATABASE_URL: celery -A agenttest_worker worker "
                    "(still waiting)"
                )
                warned = True
            time.sleep(NO_WORKER_AGAIN)

    def _say(self, text: str) -> None:
        self.progress.pause()
        print(text, file=sys.stderr, flush=True)


def _consumed_queues() -> set[str]:
    """The queues the workers that answer within a second consume."""
    from agenttest_worker.fleet.app import app  # Celery: see the note at the top

    replies = app.control.inspect(timeout=1.0).active_queues() or {}
    return {q["name"] for queues in replies.values() for q in queues or []}


def _answer_waiting(
    url: str, run_id: str, pool: AgentPool, asker: TerminalAsker, timeouts: dict[str, float]
) -> None:
    """Ask about every conversation parked for a person; resume each on the fleet."""
    store = SqlStore(url)
    for case_id, _turn in list(results.iter_case_ids(url, run_id, "awaiting_human")):
        loaded = store.load_case(run_id, case_id)
        if loaded is None:
            continue
        asked = human_question(loaded, timeouts)
        text, why = asker.ask_blocking(case_id, asked.question, asked.hint, asked.timeout)
        advance = run_async(_answer(store, pool, run_id, case_id, text, why))
        follow_up(run_id, case_id, advance)


async def _answer(
    store: ConversationStore,
    pool: AgentPool,
    run_id: str,
    case_id: str,
    text: str | None,
    why: str | None,
) -> Advance:
    try:
        return await answer_human(store, pool, run_id, case_id, text, why)
    finally:
        await close_session()
