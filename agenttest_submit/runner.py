"""Running a set of cases: store the run, execute it (here, or on a fleet), report, exit code.

Embedded default (no AGENTTEST_BROKER_URL): the conversations run in this process,
`--parallel` at a time, through the same step functions the Celery turn task runs
(agenttest_worker.conversation) against the same store (SQLite under
AGENTTEST_HOME unless AGENTTEST_DATABASE_URL says otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from agenttest_submit.human import TerminalAsker
from agenttest_submit.inputs import InputSource
from agenttest_submit.progress import Progress
from agenttest_worker.agents.registry import ProjectConfig
from agenttest_worker.aggregate import aggregate, build_report
from agenttest_worker.cases import Case
from agenttest_worker.conversation import PoolCache, answer_human, run_step
from agenttest_worker.engine import RunOptions
from agenttest_worker.report import render
from agenttest_worker.settings import get_settings
from agenttest_worker.store import repo
from agenttest_worker.store.db import upgrade

EXIT_OK, EXIT_FAILED = 0, 1


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
        fail_fast=args.fail_fast,
        awaiting_tools=list(config.awaiting_tools),
    )


def input_label(sources: Iterable[InputSource], count: int) -> str:
    return ", ".join(s.describe() for s in sources) or f"{count} cases"


def _batches(items: Iterable[repo.NewCase], size: int) -> Iterator[list[repo.NewCase]]:
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
    """Create the run and its cases (in batches); returns (run id, number of cases)."""
    upgrade(url)
    run_id = repo.new_run_id()
    repo.create_run(
        url,
        run_id=run_id,
        agent=target,
        input_label=label,
        options=options.model_dump(mode="json"),
        config=config.stored(),
        parent_run_id=parent_run_id,
        deadline_at=time.time() + deadline if deadline else None,
    )
    rows = (
        repo.NewCase(seq=i, case_id=c.id, case=c.to_record(), agent=c.agent or target)
        for i, c in enumerate(cases)
    )
    total = 0
    try:
        for batch in _batches(rows, get_settings().enqueue_batch):
            total += repo.add_cases(url, run_id, batch)
    except BaseException:
        repo.delete_run(url, run_id)
        raise
    repo.start_run(url, run_id, total)
    return run_id, total


def run_cases(
    args: argparse.Namespace,
    config: ProjectConfig,
    cases: list[Case],
    sources: list[InputSource],
    target: str | None,
) -> int:
    settings = get_settings()
    options = run_options(args, config, target)
    label = input_label(sources, len(cases))
    if settings.distributed:
        from agenttest_submit.distributed import run_distributed

        return run_distributed(args, config, cases, options, target, label)
    url = settings.effective_database_url()
    run_id, total = store_run(
        url,
        cases,
        options=options,
        config=config,
        target=target,
        label=label,
        deadline=args.deadline,
    )
    progress = Progress(total)
    timeouts = {c.id: (c.interactive.timeout if c.interactive else 300.0) for c in cases}
    asyncio.run(drive(url, run_id, [(c.id, 1) for c in cases], args.parallel, progress, timeouts))
    progress.close()
    aggregate(url, run_id)
    return emit_report(url, run_id, args)


async def drive(
    url: str,
    run_id: str,
    conversations: list[tuple[str, int]],
    parallel: int,
    progress: Progress,
    human_timeouts: dict[str, float] | None = None,
) -> None:
    """Run every conversation of the run to its end, `parallel` at a time."""
    from agenttest_worker.agents.transport import close_session

    pools = PoolCache()
    asker = TerminalAsker(progress)
    queue = iter(conversations)

    async def conversation(case_id: str, turn: int) -> None:
        while True:
            advance = await run_step(url, pools, run_id, case_id, turn, None)
            if advance.awaiting_human:
                loaded = repo.load_case(url, run_id, case_id)
                prompt = (loaded.state or {}).get("prompt") or {} if loaded else {}
                text, why = await asker.ask(
                    case_id,
                    prompt.get("question"),
                    prompt.get("hint"),
                    (human_timeouts or {}).get(case_id, 300.0),
                )
                pool = pools.for_run(run_id, loaded.run_config) if loaded else None
                if pool is None:
                    return
                advance = await answer_human(url, pool, run_id, case_id, text, why)
            if advance.next_turn is not None and advance.saved:
                turn = advance.next_turn
                continue
            if advance.case_done:
                progress.case_done(advance.status)
            return

    async def lane() -> None:
        for case_id, turn in queue:
            await conversation(case_id, turn)

    lanes = min(parallel, max(len(conversations), 1))
    try:
        await asyncio.gather(*(lane() for _ in range(lanes)))
    finally:
        await close_session()


def emit_report(url: str, run_id: str, args: argparse.Namespace) -> int:
    """Print the report (console unless --format says otherwise), write -o, exit code."""
    report = build_report(url, run_id, verbose=args.verbose, color=sys.stdout.isatty())
    stdout_format = args.format if args.format and not args.output else "console"
    sys.stdout.write(render(stdout_format, report))
    sys.stdout.flush()
    if args.output:
        report.color = False
        Path(args.output).write_text(render(args.format or "jsonl", report), encoding="utf-8")
        print(f"results written to {args.output} (run {run_id})", file=sys.stderr)
    return EXIT_FAILED if report.summary().failed else EXIT_OK
