"""Watching a run on the fleet until its reports exist: progress, people, lost messages.

`agenttest-submit` (without --no-wait) and `reeval` read the run's progress from the
database, answer conversations parked for a person from this terminal and resume them
on any worker, re-enqueue what the broker lost (the workers' sweepers do the same for
every run; see agenttest_worker.fleet.sweeper, "Recovering lost messages"), say when no
worker consumes the queue, and keep watching through a database restart. Imported once
the run is stored and started (distributed.py): none of it is on the way to the first
conversation.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from agenttest_submit.cli.stopping import run_async
from agenttest_submit.inputs.human import TerminalAsker, human_question
from agenttest_submit.run.progress import Progress
from agenttest_worker.agents import AgentPool, ProjectConfig, close_session
from agenttest_worker.driver import Advance, answer_human
from agenttest_worker.engine import RunOptions
from agenttest_worker.report import printable
from agenttest_worker.settings import get_settings
from agenttest_worker.store import (
    ConversationStore,
    error_reason,
    is_connection_lost,
    is_transient,
    open_store,
    results,
    runs,
)

# Celery is imported where it is used: see distributed.py.

POLL_SECONDS = 0.5


def follow_up(run_id: str, case_id: str, advance: Advance) -> None:
    from agenttest_worker.fleet import follow_up as enqueue  # see distributed.py

    enqueue(run_id, case_id, advance)


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
    from agenttest_worker.fleet import recover, store_refusal, sweep_interval

    stall = get_settings().stall_seconds
    next_sweep = time.monotonic() + sweep_interval(stall)
    # A run of repeated cases counts its conversations (each repetition is one).
    progress = Progress(total, label="cases" if options.distinct_cases is None else "conversations")
    ConsumerWatch(run_id, progress).start()
    asker = TerminalAsker(progress)
    pool = AgentPool(config)
    unreachable = False
    refusals = RefusalWatch(run_id, progress, store_refusal)
    try:
        while True:
            # The database may restart while we wait (the workers ride it out too):
            # keep watching rather than die with the run still going on the fleet.
            try:
                run = runs.get_run(url, run_id)
                if run is not None and run.status != "done" and options.interactive is not False:
                    _answer_waiting(url, run_id, pool, asker, human_timeouts)
            except DBAPIError as exc:
                if not is_transient(exc):
                    raise
                if not unreachable:
                    trouble = "is unreachable" if is_connection_lost(exc) else "refuses to answer"
                    print(
                        f"the database {trouble} ({printable(error_reason(exc))}); "
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
            # --repeat auto: each repetition that added the next one is counted played
            # but not finished (store/repetition_chain.py): the total grows by those.
            ended = run.passed + run.failed + run.skipped
            progress.total = total + max(ended - run.finished_cases, 0)
            progress.set(run.passed, run.failed, run.skipped)
            if run.status == "done":
                return
            refusals.check()
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


# Seconds between two looks at whether the workers' writes are refused.
REFUSALS_EVERY = 2.0


class RefusalWatch:
    """Says on stderr why the run does not move while the store refuses the workers'
    writes (the disk full, statement timeouts: fleet/store_refusals.py), and when it
    takes them again."""

    def __init__(self, run_id: str, progress: Progress, ask: Callable[[], str | None]) -> None:
        self.run_id, self.progress, self.ask = run_id, progress, ask
        self.said: str | None = None
        self.next_look = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + REFUSALS_EVERY
        try:
            reason = self.ask()
        except Exception:  # Redis out of reach: nothing to say of the store
            return
        kind = None if reason is None else reason.split(" (", 1)[0]
        if kind == (None if self.said is None else self.said.split(" (", 1)[0]):
            return
        if reason is not None:
            message = f"the store refuses writes: {reason}; run {self.run_id} waits for it"
        else:
            message = "the store takes writes again"
        self.progress.pause()
        print(printable(message), file=sys.stderr, flush=True)
        self.said = reason


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
    from agenttest_worker.fleet import app  # Celery: see the note at the top

    replies = app.control.inspect(timeout=1.0).active_queues() or {}
    return {q["name"] for queues in replies.values() for q in queues or []}


def _answer_waiting(
    url: str, run_id: str, pool: AgentPool, asker: TerminalAsker, timeouts: dict[str, float]
) -> None:
    """Ask about every conversation parked for a person; resume each on the fleet."""
    store = open_store(url)
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
