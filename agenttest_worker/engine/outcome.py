"""The end of a conversation: final assertions and the case's record, with what its
agent calls cost by role (`usage_by_role`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Literal

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.pool import AgentPool, RoleSession
from agenttest_worker.assertions import AssertionContext
from agenttest_worker.cases.case_model import Case
from agenttest_worker.engine.assess import run_assertions
from agenttest_worker.engine.attribution import case_cause
from agenttest_worker.engine.documents import final_document
from agenttest_worker.engine.end_state import at_end
from agenttest_worker.engine.state import ConversationState
from agenttest_worker.results import (
    AgentCallRecord,
    AgentRole,
    CaseResult,
    RoleUsage,
    Usage,
    UsageRole,
)


def final_context(case: Case, state: ConversationState, roles: RoleSession) -> AssertionContext:
    """What final_assertions see: the last reply, every tool call, the final document."""
    ran = [t for t in state.turns if t.input is not None]
    return AssertionContext(
        output=ran[-1].output if ran else None,
        document=final_document(state.turns, state.tool_results, _document_state(state)),
        tool_calls=[c for t in ran for c in t.tool_calls],
        input=ran[0].input if ran else None,
        messages=state.messages,
        final=True,
        case_id=case.id,
        metadata=dict(case.options.metadata) if case.options else {},
        roles=roles,
        turns=ran,
    )


def _document_state(state: ConversationState) -> Any:
    """`state` of the final document: the end state read from the agent's system when
    there is one (engine/end_state.py), else the state its replies reported."""
    return state.end_state if state.end_state is not None else state.agent_state


async def finish(case: Case, state: ConversationState, pool: AgentPool) -> None:
    """The conversation is complete: read its end state (when the case or its agent
    declares `state:`), then run final_assertions (over every turn: the earlier ones are
    read back into the state first). An end state that cannot be read fails the case,
    and its final assertions are not run: they would judge a state never seen."""
    state.phase = "done"
    state.restore_turns()
    started = time.monotonic()
    await at_end(case, state, pool)
    if state.error is not None or not case.final_assertions:
        state.elapsed_ms += int((time.monotonic() - started) * 1000)
        return
    log: list[AgentCallRecord] = []
    ran = [t for t in state.turns if t.input is not None]
    ctx = final_context(case, state, pool.session(log))
    state.final_assertions = await run_assertions(list(case.final_assertions), ctx)
    state.elapsed_ms += int((time.monotonic() - started) * 1000)
    if log and ran:
        # Judges of final assertions are calls too: kept with the last turn, so that
        # their tokens count in the case's usage and against a run's budget.
        last = ran[-1]
        last.calls = [*(last.calls or []), *log]
        usage = [c.usage for c in last.calls if c.usage is not None]
        last.usage = sum(usage, Usage()) if usage else None


# -- the result ----------------------------------------------------------------------------


def case_result(
    case: Case, state: ConversationState, agent: str | None, config: ProjectConfig | None = None
) -> CaseResult:
    """The case's record: failed if anything failed or errored, else skipped, else passed.

    `config` prices its calls (`usage_by_role`); without it every call costs 0. The
    state's earlier turns, if it holds them as text, are read back into it first."""
    state.restore_turns()
    failed = (
        state.error is not None
        or any(t.error is not None or t.status == "failed" for t in state.turns)
        or any(not a.passed for a in state.final_assertions)
    )
    status: Literal["passed", "failed", "skipped"]
    if failed:
        status = "failed"
    elif state.skip_reason is not None:
        status = "skipped"
    else:
        status = "passed"
    error = state.error
    if error is None:
        errored = [t for t in state.turns if t.error]
        error = f"turn {errored[0].turn}: {errored[0].error}" if errored else None
    usage = [t.usage for t in state.turns if t.usage is not None]
    record = CaseResult(
        id=case.id,
        name=case.name,
        status=status,
        agent=agent,
        turns=state.turns,
        final_assertions=state.final_assertions,
        total_turns=state.turns_run,
        duration_ms=state.elapsed_ms,
        error=error,
        skip_reason=state.skip_reason,
        goal_achieved=state.goal_achieved,
        simulator=case.simulator.use if case.simulator else None,
        tags=case.tags or None,
        usage=sum(usage, Usage()) if usage else None,
        file=case.source_file,
        line=case.source_line,
        repeat=case.repetition,
        repeats=case.repeat if case.repetition is not None else None,
        max_repeat=case.max_repeat if case.repetition is not None else None,
        usage_by_role=usage_by_role((c for t in state.turns for c in t.calls or ()), config)
        or None,
        end_state=state.end_state,
        trace_id=state.trace.trace_id if state.trace else None,
    )
    record.cause = case_cause(record)
    return record


# -- usage by role -------------------------------------------------------------------------

# A call's role as usage is reported: the validator is the judge.
USAGE_ROLE: dict[AgentRole, UsageRole] = {
    "target": "target",
    "simulator": "simulator",
    "validator": "judge",
    "generator": "generator",
    "reporter": "reporter",
}


def tokens_cost(
    config: ProjectConfig | None, agent: str, prompt_tokens: int, completion_tokens: int
) -> float:
    """What `agent`'s tokens cost under its `pricing` (per million tokens); 0 without one."""
    entry = config.agents.get(agent) if config is not None else None
    if entry is None or entry.pricing is None:
        return 0.0
    return (
        prompt_tokens * entry.pricing.prompt_per_million
        + completion_tokens * entry.pricing.completion_per_million
    ) / 1e6


def call_cost(call: AgentCallRecord, config: ProjectConfig | None) -> float:
    if call.usage is None:
        return 0.0
    return tokens_cost(config, call.agent, call.usage.prompt_tokens, call.usage.completion_tokens)


def usage_by_role(
    calls: Iterable[AgentCallRecord], config: ProjectConfig | None = None
) -> dict[UsageRole, RoleUsage]:
    """Calls, tokens and cost of `calls` by role (only the roles that made one). A call
    that reported no usage (an agent that does not, a failed call) counts with 0 tokens."""
    sums: dict[UsageRole, list[float]] = {}
    for call in calls:
        found = sums.setdefault(USAGE_ROLE[call.role], [0, 0, 0, 0, 0.0, 0])
        found[0] += 1
        if call.cached:
            found[5] += 1  # served from the reply cache: it used nothing
        elif call.usage is not None:
            found[1] += call.usage.prompt_tokens
            found[2] += call.usage.completion_tokens
            found[3] += call.usage.total_tokens
            found[4] += call_cost(call, config)
    return {
        role: RoleUsage(
            calls=int(n),
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
            total_tokens=int(total),
            # Rounded: sums of per-call costs carry float noise (0.30000000000000004).
            cost=round(cost, 9),
            cached=int(cached) or None,
        )
        for role, (n, prompt, completion, total, cost, cached) in sums.items()
    }
