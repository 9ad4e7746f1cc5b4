"""An embedded run: the conversations run in this process, `--parallel` at a time.

The default (no AGENTTEST_BROKER_URL): the conversations run through the same step
functions the Celery turn task runs (agenttest_worker.driver.step) against the same
store (SQLite under AGENTTEST_HOME unless AGENTTEST_DATABASE_URL says otherwise).
`run_embedded` stores and runs a new run and reports it; `drive` plays a stored run's
conversations to their end (also for `resume` and the new cases of a re-evaluation).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Sized
from datetime import UTC, datetime

from agenttest_submit.cli.request import RunRequest
from agenttest_submit.cli.stopping import run_async
from agenttest_submit.inputs.expand import Spool
from agenttest_submit.inputs.human import TerminalAsker, human_question
from agenttest_submit.run.driving import driving
from agenttest_submit.run.output import emit_report
from agenttest_submit.run.progress import Progress
from agenttest_submit.run.runner import new_run, run_suite
from agenttest_submit.run.storing import write_run
from agenttest_worker.agents import (
    ProjectConfig,
    ReplyCacheStore,
    close_session,
    configure_pool,
    connections_for,
)
from agenttest_worker.driver import (
    RUN_CANCELS,
    Advance,
    PoolCache,
    TurnAddress,
    answer_human,
    end_refused,
    inline,
    options_of,
    receive_spans,
    run_step,
    stored_spans,
)
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import ConfigError, InputProblem
from agenttest_worker.observe import flush_traces
from agenttest_worker.report import printable
from agenttest_worker.results import DEADLINE_PASSED
from agenttest_worker.settings import get_settings
from agenttest_worker.store import BufferedStore

# The store (SQLAlchemy, the models, the repository) is imported where it is used, not
# here: a new embedded run is stored on the store's thread while its first
# conversations run (see run_embedded).


def run_embedded(
    request: RunRequest,
    url: str,
    spool: Spool,
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
    *,
    parent_run_id: str | None = None,
) -> int:
    """Run checked cases in this process, storing the run while it starts (a rerun's
    with `parent_run_id`, the run its cases were chosen from).

    Importing the store and writing the run and its cases take a few tenths of a
    second that the first conversations need not wait for (they wait on the agent
    most of the time): the store's thread does it (BufferedStore.fresh) while they run
    from memory, and nothing is written before it is done. A store that cannot be
    written still fails the run, at its first write instead of before its first turn.
    """
    settings = get_settings()
    if not settings.database_url:
        # The one store problem worth catching before any agent is called: a home
        # that cannot be a directory (a typo, a file in the way, no permission).
        try:
            settings.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                InputProblem(
                    f"cannot create the local store's directory {settings.home}: "
                    f"{exc.strerror or exc}",
                    field="AGENTTEST_HOME",
                )
            ) from None
    # What the first agent call imports, imported before the store's thread starts:
    # both are CPU work, and the calls should not wait for the store's share of it.
    if any(agent.protocol != "script" for agent in config.agents.values()):
        import aiohttp  # noqa: F401  (agents/http/exchange.py imports it where a call needs it)

    # The conversations start now, while the run is being stored.
    run = new_run(
        options,
        config,
        target,
        label,
        request.deadline,
        suite=run_suite(request, target),
        parent_run_id=parent_run_id,
        started_at=datetime.now(UTC),
    )
    try:
        receiver = receive_spans(url, expected=[run.run_id])
    except OSError as exc:
        port = settings.otlp_receiver_port
        raise ConfigError(
            InputProblem(
                f"cannot receive spans on port {port}: {exc.strerror or exc}",
                field="AGENTTEST_OTLP_RECEIVER_PORT",
            )
        ) from None
    # The cases are read from the spool twice, each on a handle of its own: once as
    # the conversations are played, once as the store's thread writes them.
    store = BufferedStore.fresh(
        url,
        run.run_id,
        spool.records(),
        spool.conversations,
        options=run.options,
        config=run.config,
        deadline_at=run.deadline_at,
        setup=functools.partial(write_run, url, run, spool.stored_records()),
    )
    # A run of repeated cases counts its conversations (each repetition is one).
    label = "cases" if options.distinct_cases is None else "conversations"
    progress = Progress(spool.conversations, label=label)
    try:
        run_async(
            drive(url, run.run_id, store.admitting(), request.parallel, progress, store=store)
        )
    finally:
        if receiver is not None:
            receiver.stop()
    progress.close()
    # The store: see the note at the top.
    from agenttest_worker.report import aggregate

    built = aggregate(url, run.run_id)
    flush_traces()  # the run's spans exported before this process may end
    if request.wait:
        return emit_report(url, run.run_id, request, built)
    # --no-wait: this process plays the run, so it returns when the run has ended; as
    # on a fleet, stdout has the run id alone (RUN=$(agenttest-submit ... --no-wait)),
    # and the report goes to stderr (or -o).
    with contextlib.redirect_stdout(sys.stderr):
        code = emit_report(url, run.run_id, request, built)
    print(run.run_id, flush=True)
    return code


async def drive(
    url: str,
    run_id: str,
    conversations: Iterable[tuple[str, int]],
    parallel: int,
    progress: Progress,
    human_timeouts: dict[str, float] | None = None,
    *,
    parked: Collection[str] = (),
    ask: bool = True,
    store: BufferedStore | None = None,
) -> None:
    """Run every conversation of the run to its end, `parallel` at a time.

    `parked` names conversations already waiting for a person (a resumed run); they
    start with the question. With `ask` false nobody is at a terminal: a conversation
    that waits for a person gets no reply, and its on_missing_input decides.

    This process owns the run, so its conversations live in a BufferedStore: the same
    steps and guards as on a worker, written to the store in batches. `store` is the
    run's, when the caller made it; otherwise it is read from the database.
    """
    with driving(run_id):  # `resume` elsewhere refuses while this runs (driving.py)
        await _drive(
            url, run_id, conversations, parallel, progress, human_timeouts, parked, ask, store
        )


def _reply_cache(url: str) -> ReplyCacheStore:
    # Imported here, as the module's other store imports are: the store's SQL modules
    # load SQLAlchemy, which the submitter's start-up does without.
    from agenttest_worker.store import reply_cache_at

    replies: ReplyCacheStore = reply_cache_at(url)
    return replies


async def _drive(
    url: str,
    run_id: str,
    conversations: Iterable[tuple[str, int]],
    parallel: int,
    progress: Progress,
    human_timeouts: dict[str, float] | None,
    parked: Collection[str],
    ask: bool,
    store: BufferedStore | None,
) -> None:
    if store is None:
        store = BufferedStore.from_database(url, run_id)
    pools = PoolCache(
        replies=functools.partial(_reply_cache, url), spans=functools.partial(stored_spans, url)
    )
    asker = TerminalAsker(progress)
    queue = iter(conversations)
    ended_refused: set[str] = set()
    said_refusing: list[str | None] = [None]

    def write(now: bool = False) -> None:
        """The store's buffer to the database (`now`, or when it is due); then each
        conversation with a step the database refused ends failed, as a worker ends it."""

        def say() -> None:
            _say_refusing(store, progress, said_refusing)

        if now:
            store.flush(told=say)
        else:
            store.maybe_flush()
            say()
        while refused := store.take_refused():
            for found in refused:
                if found.case_id in ended_refused:
                    # Its failure was refused too: nothing more this process can write.
                    raise RuntimeError(f"the database refused case {found.case_id}: {found.reason}")
                ended_refused.add(found.case_id)
                progress.take_back(found.ended_as)
                advance = end_refused(store, run_id, found.case_id, found.turn, found.reason)
                if advance.case_done:
                    progress.case_done(advance.status)
            progress.draw(force=True)  # the counts changed, not necessarily the count done
            store.flush()

    async def reply(case_id: str) -> Advance:
        loaded = store.load_case(run_id, case_id)
        if loaded is None:
            return Advance(saved=False)
        if ask:
            asked = human_question(loaded, human_timeouts)
            text, why = await asker.ask(case_id, asked.question, asked.hint, asked.timeout)
        else:
            text, why = None, None
        pool = pools.for_run(run_id, loaded.run_config, options_of(loaded))
        return await answer_human(store, pool, run_id, case_id, text, why)

    async def conversation(case_id: str, turn: int) -> None:
        waiting = case_id in parked
        while True:
            if waiting:
                advance = await reply(case_id)
                waiting = False
            else:
                at = TurnAddress(run_id, case_id, turn, None)
                advance = await run_step(store, pools, at, inline)
                if advance.awaiting_human:
                    advance = await reply(case_id)
            write()
            if advance.next_turn is not None and advance.saved:
                turn = advance.next_turn
                continue
            if advance.added is not None:
                # Counted before the end that added it: the count done never meets the
                # total before the last conversation has ended (the CI log's lines
                # would stop at a total that grew since).
                progress.total += 1
            if advance.case_done:
                progress.case_done(advance.status)
            if advance.added is None:
                return
            # --repeat auto: the case's next repetition, in this lane (it takes the place
            # of the one that ended, as on a fleet: store/repetition_chain.py).
            case_id, turn = advance.added, 1

    def past(deadline_at: float | None) -> bool:
        return deadline_at is not None and time.time() >= deadline_at

    async def lane() -> None:
        # No case is taken past the deadline: a step past it ends its conversation
        # without awaiting anything, so a lane taking case after case would never give
        # the loop back, and the deadline's own timer would wait for it to run out.
        while not past(deadline_at) and (taken := next(queue, None)) is not None:
            await conversation(*taken)

    async def end_at_deadline(case_id: str) -> None:
        loaded = store.load_case(run_id, case_id)
        if loaded is None or loaded.phase not in ("pending", "ready"):
            return
        at = TurnAddress(run_id, case_id, loaded.next_turn, None)
        advance = await run_step(store, pools, at, inline)
        if advance.case_done:
            progress.case_done(advance.status)

    async def past_deadline(deadline_at: float) -> None:
        """--deadline: the turns still running were cancelled; end every conversation
        left (they fail with the run's deadline as the reason, keeping their turns).
        Those never started end together: a fresh run's in one statement of the
        store's next flush, a resumed run's one step each."""
        await asyncio.sleep(max(deadline_at - time.time(), 0) + 0.01)
        for case_id in list(store.conversations):  # the repetitions added too
            await end_at_deadline(case_id)
        progress.case_done("failed", store.end_unadmitted(DEADLINE_PASSED))
        for case_id, _ in queue:
            await end_at_deadline(case_id)

    left = len(conversations) if isinstance(conversations, Sized) else store.run.total_cases
    lanes = min(parallel, max(left, 1))
    configure_pool(connections_for(parallel))  # (before this loop's first agent call)
    deadline_at = store.run.deadline_at
    # Written when due even while no conversation moves (a slow agent): killed
    # outright, the run loses at most its last half second of turns.
    timer = asyncio.create_task(store.flush_on_timer(write))
    watch = asyncio.create_task(_cancelled_elsewhere(url, run_id, store))
    try:
        work = await _started_one_by_one(lane, lanes)
        if deadline_at is None:
            await work
        else:
            # A turn in flight is not left to finish after the deadline (it may take
            # minutes): it is cancelled, and its conversation ends as failed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(work, timeout=max(deadline_at - time.time(), 0))
            if past(deadline_at):  # (the lanes may have stopped just before the timer)
                await past_deadline(deadline_at)
    finally:
        timer.cancel()
        watch.cancel()
        try:
            write(now=True)
        finally:
            await close_session()
    if timer.done() and not timer.cancelled() and (failed := timer.exception()) is not None:
        raise failed  # a write on the timer failed as a conversation's would have


# How often the process driving a run reads whether `agenttest-submit cancel` marked it.
CANCEL_POLL_SECONDS = 1.0


async def _cancelled_elsewhere(url: str, run_id: str, store: BufferedStore) -> None:
    """`agenttest-submit cancel RUN` from another process marks the run in the database:
    seen here, the run is cancelled in this process's store too (each conversation's
    next step ends it skipped) and its turns in flight are cut (run_cancels.py)."""
    from agenttest_worker.store import runs  # the store: see the note at the top

    while not store.run.cancelled:
        await asyncio.sleep(CANCEL_POLL_SECONDS)
        try:
            row = await asyncio.to_thread(runs.get_run, url, run_id)
        except Exception:  # the store's own writes say what is wrong with it
            continue
        if row is not None and row.cancelled and not store.run.cancelled:
            store.cancel_run(run_id, row.cancel_reason or "cancelled")
            RUN_CANCELS.cancel(run_id)
            return


def _say_refusing(store: BufferedStore, progress: Progress, said: list[str | None]) -> None:
    """Say once when the database starts refusing the run's writes for now (the disk
    full, a statement timeout), and once when it takes them again: the turns played
    meanwhile are kept, not played again (BufferedStore.flush)."""
    kind = None if store.refusing is None else store.refusing.split(" (", 1)[0]
    if kind == said[0]:
        return
    with progress.held():
        if kind is not None:
            message = (
                f"the store refuses writes: {store.refusing}; the turns played are kept "
                "and written once it takes them"
            )
        else:
            message = "the store takes writes again"
        print(printable(message), file=sys.stderr, flush=True)
    said[0] = kind


async def _started_one_by_one(
    lane: Callable[[], Coroutine[object, object, None]], count: int
) -> asyncio.Future[list[None]]:
    """`count` lanes started one at a time, the loop given a turn between two: a lane's
    first call then reaches its agent while the next lanes start. Started all at once,
    every lane's first step ran before any connection could
    complete, and the run's first call left after the hundredth lane's start-up
    (benchmarks/embedded.py). Cancelled meanwhile, the lanes started are cancelled too."""
    started: list[asyncio.Task[None]] = []
    try:
        for _ in range(count):
            started.append(asyncio.ensure_future(lane()))
            await asyncio.sleep(0)
    except BaseException:
        for task in started:
            task.cancel()
        # Ended before the caller goes on (its last write), as a gather's lanes would be.
        await asyncio.gather(*started, return_exceptions=True)
        raise
    return asyncio.gather(*started)
