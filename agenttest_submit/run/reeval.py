"""`--reeval`: judge stored conversations again, without calling any target agent.

    agenttest-submit --reeval RUN            re-run the assertions of RUN's cases on its
                                             stored conversations
    agenttest-submit --reeval -i tests.yml   the tdx behaviour: cases whose id has a stored
                                             conversation (the newest one, or RUN's with
                                             --reeval RUN) are re-judged with the file's
                                             current criteria; new cases run normally

A stored conversation stands in for a case only if it is that case's conversation: the
same target agent, the same scripted inputs (turn inputs, attachments, tool mocks) and at
least one turn played. Otherwise (the inputs were edited, say) re-judging the old
replies would judge a conversation the case no longer describes, so the case runs again
like a new one, and stderr says why.

Either way the result is a new run, linked to the run the conversations came from
(`parent_run_id`), reported like any other.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

from agenttest_submit.cli.request import RunRequest
from agenttest_submit.cli.stopping import run_async
from agenttest_submit.inputs.expand import Selection
from agenttest_submit.run.distributed import database_url, enqueue_run
from agenttest_submit.run.embedded import drive
from agenttest_submit.run.fleet_watch import wait_for_run
from agenttest_submit.run.output import emit_report
from agenttest_submit.run.progress import Progress
from agenttest_submit.run.reporter_agent import reporter_problem
from agenttest_submit.run.runner import resolve_run, run_options, run_suite, store_run
from agenttest_worker.agents import AgentPool, ProjectConfig, close_session, config_from_stored
from agenttest_worker.cases import Case
from agenttest_worker.driver import reevaluate
from agenttest_worker.engine import ConversationState, RunOptions, case_result
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import aggregate, printable
from agenttest_worker.settings import get_settings
from agenttest_worker.store import (
    Step,
    StoredConversation,
    open_store,
    runs,
    stored_conversations,
    upgrade,
)


def _url() -> str:
    settings = get_settings()
    url = settings.database_url if settings.distributed else settings.effective_database_url()
    if not url:
        url = database_url()
    upgrade(url)
    return url


def _check_reporter(request: RunRequest, config: ProjectConfig) -> None:
    problem = reporter_problem(config, request.reporter)
    if problem is not None:
        raise InputError(problem)


def reeval_run(request: RunRequest, config: ProjectConfig) -> int:
    """--reeval RUN: every finished conversation of RUN, with its own case definitions."""
    url = _url()
    assert request.reeval is not None
    source = resolve_run(url, request.reeval)
    stored = stored_conversations(url, run_id=source.id)
    if not stored:
        raise InputError(InputProblem(f"run {source.id} has no finished conversations to re-judge"))
    ordered = sorted(stored.values(), key=lambda s: s.seq)
    selection = Selection(tags=list(request.tags), ids=list(request.ids))
    everything = [Case.model_validate(s.case) for s in ordered]
    if any(c.key != s.case_id for c, s in zip(everything, ordered, strict=True)):
        # A run of several targets keys a case's conversations by target (ID@TARGET):
        # a case would stand for two conversations here.
        raise InputError(
            InputProblem(
                f"run {source.id} played several targets: re-judge a run of one target",
                field="--reeval",
            )
        )
    cases = [c for c in everything if selection.wants(c)]
    if not cases:
        raise InputError(
            InputProblem(f"no case of run {source.id} matches the --tag/--id selection")
        )
    if not config.agents:
        config = config_from_stored(source.config)
    _check_reporter(request, config)
    label = f"re-evaluation of {source.id}"
    # A re-judged run stays in its run's suite, unless --suite says otherwise.
    suite = request.suite or source.suite
    return _reeval(request, config, url, cases, stored, label, source.agent, suite)


def _script(case: Case | dict[str, Any]) -> list[Any]:
    """What the conversation was played from: each turn's input, attachments and tool
    mocks, and the case's mocks. Assertions and criteria are not in it: changing those
    is what re-evaluation is for."""
    model = case if isinstance(case, Case) else Case.model_validate(case)
    return [
        model.tool_mocks,
        [
            (t.input, [a.model_dump(mode="json") for a in t.attachments], t.tool_mocks)
            for t in model.turns
        ],
    ]


def _stale(case: Case, stored: StoredConversation, target: str | None) -> str | None:
    """Why `stored` cannot stand in for `case`'s conversation (None: it can)."""
    agent = case.agent or target
    if agent is not None and stored.agent is not None and stored.agent != agent:
        return f"it was held with {stored.agent}, not {agent}"
    state = ConversationState.model_validate(stored.state)
    if state.turns_run == 0:
        return "no turn of it was played"
    try:
        if _script(stored.case) != _script(case):
            return "the case's inputs changed since"
    except ValueError:  # a stored case this version no longer reads
        return "its stored case cannot be read"
    return None


def reeval_cases(request: RunRequest, config: ProjectConfig, cases: list[Case]) -> int:
    """--reeval [RUN] -i FILE: re-judge the stored conversations of these case ids."""
    url = _url()
    ref = request.reeval
    run_id = None if ref is None or ref == "last" else resolve_run(url, ref).id
    target = request.agent or config.defaults.agent
    # A repeated case (its `repeat`, --repeat) is each of its repetitions' conversation.
    cases = [r for c in cases for r in c.repetitions(request.repeat or c.repeat or 1)]
    found = stored_conversations(url, [c.key for c in cases], run_id)
    stored: dict[str, StoredConversation] = {}
    for case in cases:
        if case.key not in found:
            continue
        why = _stale(case, found[case.key], target)
        if why is None:
            stored[case.key] = found[case.key]
        else:
            print(
                f"{printable(case.key)}: its stored conversation (run {found[case.key].run_id}) "
                f"is not re-judged, {why}; the case runs again",
                file=sys.stderr,
            )
    label = f"re-evaluation of {len(stored)} stored conversation(s)"
    return _reeval(request, config, url, cases, stored, label, target)


def _reeval(
    request: RunRequest,
    config: ProjectConfig,
    url: str,
    cases: list[Case],
    stored: dict[str, StoredConversation],
    label: str,
    target: str | None,
    suite: str | None = None,
) -> int:
    cached = [c for c in cases if c.key in stored]
    fresh = [c for c in cases if c.key not in stored]
    sources = Counter(stored[c.key].run_id for c in cached)
    parent = sources.most_common(1)[0][0] if sources else None
    options = run_options(request, config, target)
    if any(c.repetition is not None for c in cases):
        options = options.model_copy(update={"distinct_cases": len({c.id for c in cases})})
    run_id, total = store_run(
        url,
        cases,
        options=options,
        config=config,
        target=target,
        label=label if not fresh else f"{label} + {len(fresh)} new case(s)",
        parent_run_id=parent,
        suite=suite or run_suite(request, target),
    )
    print(
        f"run {run_id}: re-judging {len(cached)} stored conversation(s)"
        + (f", running {len(fresh)} new case(s)" if fresh else "")
        + (f" (from run {parent})" if parent else ""),
        file=sys.stderr,
        flush=True,
    )
    progress = Progress(total)
    run_async(_rejudge_all(url, run_id, cached, stored, config, request.parallel, progress))
    if fresh:
        _run_fresh(request, url, run_id, fresh, config, options, progress)
    progress.close()
    current = runs.get_run(url, run_id)
    if current is not None and current.status == "running":
        aggregate(url, run_id)
    return emit_report(url, run_id, request)


async def _rejudge_all(
    url: str,
    run_id: str,
    cases: list[Case],
    stored: dict[str, StoredConversation],
    config: ProjectConfig,
    parallel: int,
    progress: Progress,
) -> None:
    if not cases:
        return
    pool = AgentPool(config)
    store = open_store(url)
    queue = iter(cases)

    async def lane() -> None:
        for case in queue:
            conversation = stored[case.key]
            state = ConversationState.model_validate(conversation.state)
            new_state = await reevaluate(case, state, pool)
            result = case_result(case, new_state, conversation.agent, config)
            store.save_step(
                Step(
                    run_id=run_id,
                    case_id=case.key,
                    expected_turn=1,
                    next_turn=new_state.turns_run + 1,
                    phase="done",
                    state=new_state.model_dump(mode="json"),
                    new_turns=new_state.turns,
                    final_assertions=new_state.final_assertions,
                    result=result,
                )
            )
            progress.case_done(result.status)

    try:
        await asyncio.gather(*(lane() for _ in range(max(1, min(parallel, len(cases))))))
    finally:
        await close_session()


def _run_fresh(
    request: RunRequest,
    url: str,
    run_id: str,
    fresh: list[Case],
    config: ProjectConfig,
    options: RunOptions,
    progress: Progress,
) -> None:
    """Cases with no stored conversation run normally, in the same new run."""
    if get_settings().distributed:
        current = runs.get_run(url, run_id)
        total = current.total_cases if current else len(fresh)
        # Only conversations not started yet start: the re-judged ones are already done.
        enqueue_run(run_id, total)
        wait_for_run(url, run_id, total, config, options, {})
        return
    run_async(drive(url, run_id, [(c.key, 1) for c in fresh], request.parallel, progress))
