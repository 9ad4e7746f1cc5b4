"""Running a set of cases: store the run, execute it (here, or on a fleet), report, exit code.

Embedded default (no AGENTTEST_BROKER_URL): the conversations run in this process,
`--parallel` at a time, through the same step functions the Celery turn task runs
(agenttest_worker.driver.step) against the same store (SQLite under
AGENTTEST_HOME unless AGENTTEST_DATABASE_URL says otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from agenttest_submit.expand import CaseStream, Spool, print_warnings
from agenttest_submit.human import TerminalAsker
from agenttest_submit.inputs import InputSource
from agenttest_submit.progress import Progress
from agenttest_submit.stopping import run_async
from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.cases.model import Case
from agenttest_worker.driver.step import (
    Advance,
    PoolCache,
    answer_human,
    end_refused,
    run_step,
)
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import ConfigError, InputProblem
from agenttest_worker.report import RunReport, render
from agenttest_worker.settings import get_settings
from agenttest_worker.store import steps
from agenttest_worker.store.buffered import BufferedStore, StoreSetup

# The store (SQLAlchemy, the models, the repository) is imported where it is used, not
# here: a new embedded run imports it on a thread while its first conversations run
# (see run_embedded).

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def run_options(args: argparse.Namespace, config: ProjectConfig, target: str | None) -> RunOptions:
    interactive: bool | None
    if args.skip_interactive or not sys.stdin.isatty():
        # Without a terminal there is nobody to ask: on_missing_input decides.
        interactive = False
    elif args.interactive:
        interactive = True
    else:
        interactive = None
    return RunOptions(
        target=target,
        connector=args.connector,
        on_missing_input=args.on_missing_input,
        interactive=interactive,
        case_timeout=args.timeout,
        turn_timeout=getattr(args, "turn_timeout", None),
        fail_fast=args.fail_fast,
        awaiting_tools=list(config.awaiting_tools),
        max_tokens=getattr(args, "max_tokens", None),
        max_cost=getattr(args, "max_cost", None),
    )


def input_label(sources: Iterable[InputSource], count: int) -> str:
    return ", ".join(s.describe() for s in sources) or f"{count} cases"


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def store_run(
    url: str,
    cases: Iterable[Case],
    *,
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
    deadline: float | None = None,
    parent_run_id: str | None = None,
) -> tuple[str, int]:
    """Create the run and its cases; returns (run id, number of cases)."""
    records = ((c.id, c.agent or target, c.to_record()) for c in cases)
    return store_records(
        url,
        records,
        options=options,
        config=config,
        target=target,
        label=label,
        deadline=deadline,
        parent_run_id=parent_run_id,
    )


class RunStarter(Protocol):
    """Starts a run's conversations while the rest of its cases are still being stored."""

    def stored(self, run_id: str, first: int, last: int) -> None:
        """Cases `first`..`last` (their positions in the run) are stored."""

    def started(self, run_id: str, every_case_ended: bool) -> None:
        """Every case is stored and the run is running; its conversations may all have
        ended already (then nobody else will enqueue its aggregation)."""


def store_records(
    url: str,
    records: Iterable[steps.CaseRecord],
    *,
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
    deadline: float | None = None,
    parent_run_id: str | None = None,
    starter: RunStarter | None = None,
) -> tuple[str, int]:
    """Create the run and store (case id, agent, record) rows a batch at a time."""
    run_id = steps.new_run_id()
    total = write_run(
        url,
        run_id,
        records,
        options=options.model_dump(mode="json"),
        config=config.stored(),
        target=target,
        label=label,
        deadline_at=time.time() + deadline if deadline else None,
        parent_run_id=parent_run_id,
        starter=starter,
    )
    return run_id, total


def write_run(
    url: str,
    run_id: str,
    records: Iterable[steps.CaseRecord],
    *,
    options: dict[str, Any],
    config: dict[str, Any],
    target: str | None,
    label: str,
    deadline_at: float | None,
    parent_run_id: str | None = None,
    starter: RunStarter | None = None,
    started_at: datetime | None = None,
) -> int:
    """Bring the store up to date, create the run, add its cases, start it.

    With a `starter`, each batch of cases is handed to it as soon as it is stored, so
    a fleet works on the first conversations while the rest are written. The run's
    start (what its reports' duration counts from) is `started_at` if given (an
    embedded run's conversations begin before it is stored), else when the first batch
    was handed out, else now.
    """
    from agenttest_worker.store import repo
    from agenttest_worker.store.db import upgrade

    upgrade(url)
    repo.create_run(
        url,
        run_id=run_id,
        agent=target,
        input_label=label,
        options=options,
        config=config,
        parent_run_id=parent_run_id,
        deadline_at=deadline_at,
    )
    rows = (
        repo.NewCase(seq=i, case_id=case_id, case=record, agent=agent)
        for i, (case_id, agent, record) in enumerate(records)
    )
    total = 0
    first_started: datetime | None = None
    try:
        for batch in _batches(rows, get_settings().enqueue_batch):
            total += repo.add_cases(url, run_id, batch)
            if starter is not None:
                first_started = first_started or datetime.now(UTC)
                starter.stored(run_id, total - len(batch), total - 1)
    except BaseException:
        # Conversations of the batches already started find their run gone and stop.
        repo.delete_run(url, run_id)
        raise
    every_case_ended = repo.start_run(url, run_id, total, started_at=started_at or first_started)
    if starter is not None:
        starter.started(run_id, every_case_ended)
    return total


def run_cases(
    args: argparse.Namespace,
    config: ProjectConfig,
    stream: CaseStream,
    sources: list[InputSource],
    target: str | None,
) -> int:
    """Store the stream's cases (rejecting bad input before anything runs), run, report."""
    from agenttest_worker.heap import settle

    settle()  # start-up is over: see heap.py
    settings = get_settings()
    options = run_options(args, config, target)
    label = input_label(sources, 0)
    url = settings.effective_database_url()
    if settings.distributed:
        from agenttest_submit.distributed import database_url, import_celery_meanwhile

        url = database_url()
        import_celery_meanwhile()
    # Every case is checked (and every problem reported) before anything is stored.
    with Spool(stream, target) as spool:
        print_warnings(stream.warnings)
        if not settings.distributed:
            return run_embedded(args, url, list(spool.records()), options, config, target, label)
        from agenttest_submit.distributed import FleetStarter, run_distributed

        run_id, total = store_records(
            url,
            spool.records(),
            options=options,
            config=config,
            target=target,
            label=label,
            deadline=args.deadline,
            starter=FleetStarter(),
        )

    return run_distributed(args, url, run_id, total, config, options)


def run_embedded(
    args: argparse.Namespace,
    url: str,
    records: list[steps.CaseRecord],
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
) -> int:
    """Run checked cases in this process, storing the run while it starts.

    Importing the store and writing the run and its cases take a few tenths of a
    second that the first conversations need not wait for (they wait on the agent
    most of the time): a thread does it (StoreSetup) while they run from memory, and
    nothing is written before it is done. A store that cannot be written still fails
    the run, at its first write instead of before its first turn.
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
    import aiohttp  # noqa: F401  (agents/transport.py imports it where a call is made)

    run_id = steps.new_run_id()
    stored_options, stored_config = options.model_dump(mode="json"), config.stored()
    deadline_at = time.time() + args.deadline if args.deadline else None
    # The conversations start now, while the run is being stored.
    began = datetime.now(UTC)
    setup = StoreSetup(
        lambda: write_run(
            url,
            run_id,
            records,
            options=stored_options,
            config=stored_config,
            target=target,
            label=label,
            deadline_at=deadline_at,
            started_at=began,
        )
    )
    store = BufferedStore.fresh(
        url,
        run_id,
        records,
        options=stored_options,
        config=stored_config,
        deadline_at=deadline_at,
        setup=setup,
    )
    progress = Progress(len(records))
    conversations = [(case_id, 1) for case_id, _, _ in records]
    run_async(drive(url, run_id, conversations, args.parallel, progress, store=store))
    progress.close()
    from agenttest_worker.fleet.aggregate import aggregate

    return emit_report(url, run_id, args, aggregate(url, run_id))


async def drive(
    url: str,
    run_id: str,
    conversations: list[tuple[str, int]],
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
    from agenttest_worker.agents.transport import close_session

    if store is None:
        store = BufferedStore.from_database(url, run_id)
    pools = PoolCache()
    asker = TerminalAsker(progress)
    queue = iter(conversations)
    ended_refused: set[str] = set()

    def write(now: bool = False) -> None:
        """The store's buffer to the database (`now`, or when it is due); then each
        conversation with a step the database refused ends failed, as a worker ends it."""
        if now:
            store.flush()
        else:
            store.maybe_flush()
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
        pool = pools.for_run(run_id, loaded.run_config)
        return await answer_human(store, pool, run_id, case_id, text, why)

    async def conversation(case_id: str, turn: int) -> None:
        waiting = case_id in parked
        while True:
            if waiting:
                advance = await reply(case_id)
                waiting = False
            else:
                advance = await run_step(store, pools, run_id, case_id, turn, None)
                if advance.awaiting_human:
                    advance = await reply(case_id)
            write()
            if advance.next_turn is not None and advance.saved:
                turn = advance.next_turn
                continue
            if advance.case_done:
                progress.case_done(advance.status)
            return

    async def lane() -> None:
        for case_id, turn in queue:
            await conversation(case_id, turn)

    async def past_deadline(deadline_at: float) -> None:
        """--deadline: the turns still running were cancelled; end every conversation
        left (they fail with the run's deadline as the reason, keeping their turns)."""
        await asyncio.sleep(max(deadline_at - time.time(), 0) + 0.01)
        for case_id, _ in conversations:
            loaded = store.load_case(run_id, case_id)
            if loaded is None or loaded.phase not in ("pending", "ready"):
                continue
            advance = await run_step(store, pools, run_id, case_id, loaded.next_turn, None)
            if advance.case_done:
                progress.case_done(advance.status)

    lanes = min(parallel, max(len(conversations), 1))
    deadline_at = store.run.deadline_at
    try:
        work = asyncio.gather(*(lane() for _ in range(lanes)))
        if deadline_at is None:
            await work
        else:
            # A turn in flight is not left to finish after the deadline (it may take
            # minutes): it is cancelled, and its conversation ends as failed.
            try:
                await asyncio.wait_for(work, timeout=max(deadline_at - time.time(), 0))
            except TimeoutError:
                await past_deadline(deadline_at)
    finally:
        try:
            write(now=True)
        finally:
            await close_session()


@dataclass(frozen=True)
class HumanQuestion:
    question: str | None
    hint: str | None
    timeout: float


def human_question(
    loaded: steps.LoadedCase, timeouts: Mapping[str, float] | None = None
) -> HumanQuestion:
    """What to ask a person about a conversation parked for one: the engine's prompt,
    and how long to wait (`timeouts` for this case, else the stored case's
    interactive.timeout in seconds, else the spec's default: 5m)."""
    prompt = (steps.as_object(loaded.state) or {}).get("prompt") or {}
    timeout = (timeouts or {}).get(loaded.case_id)
    if not timeout:
        interactive = (steps.as_object(loaded.case) or {}).get("interactive")
        stored = interactive.get("timeout") if isinstance(interactive, dict) else None
        timeout = float(stored) if isinstance(stored, int | float) else 300.0
    return HumanQuestion(prompt.get("question"), prompt.get("hint"), timeout)


def _rendered(fmt: str, report: RunReport) -> str:
    """`render`, unless the aggregator rendered the same report in `fmt` already."""
    text = report.rendered.get(fmt)
    return text if text is not None else render(fmt, report)


def emit_report(
    url: str, run_id: str, args: argparse.Namespace, built: RunReport | None = None
) -> int:
    """Print the report (console unless --format says otherwise), write -o, exit code.

    `built` is the aggregator's report when this process just built it: the results
    are not read from the store a second time.
    """
    color = sys.stdout.isatty()
    if built is not None:
        report = built
        if (report.verbose, report.color) != (args.verbose, color):
            report.verbose, report.color, report.rendered = args.verbose, color, {}
    else:
        from agenttest_worker.fleet.aggregate import build_report

        report = build_report(url, run_id, verbose=args.verbose, color=color)
    stdout_format = args.format if args.format and not args.output else "console"
    sys.stdout.write(_rendered(stdout_format, report))
    sys.stdout.flush()
    if args.output:
        if report.color:
            report.color, report.rendered = False, {}
        try:
            text = _rendered(args.format or "jsonl", report)
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            # Checked before the run started; this is the disk filling up or the like.
            print(
                f"agenttest-submit: cannot write {args.output}: {exc.strerror or exc}; the "
                f"results are stored: agenttest-submit report {run_id} -o FILE",
                file=sys.stderr,
            )
            return EXIT_INPUT
        print(f"results written to {args.output} (run {run_id})", file=sys.stderr)
    if getattr(args, "reporter", None):
        _custom_report(url, run_id, args.reporter, report)
    return EXIT_FAILED if report.summary().failed else EXIT_OK


def _custom_report(url: str, run_id: str, use: str, report: RunReport) -> None:
    """--reporter: the reporter agent's account, stored with the run and printed."""
    from agenttest_submit.reporter_agent import run_reporter
    from agenttest_worker.agents.base import AgentError
    from agenttest_worker.store import repo

    run = repo.get_run(url, run_id)
    config = ProjectConfig.from_stored(run.config) if run is not None else ProjectConfig()
    try:
        text = run_reporter(use, report, config)
    except AgentError as exc:
        # The run's own results stand; only the extra report is missing.
        print(f"warning: reporter {use} failed: {exc.message}", file=sys.stderr)
        return
    repo.store_report(url, run_id, "reporter", text)
    sys.stdout.write(f"\n── Report by {use} ──\n{text.rstrip()}\n")
    sys.stdout.flush()
