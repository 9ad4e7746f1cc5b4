"""The end of a conversation: final assertions and the case's record."""

from __future__ import annotations

import time
from typing import Literal

from agenttest_worker.agents.pool import AgentPool, RoleSession
from agenttest_worker.assertions import AssertionContext
from agenttest_worker.cases.model import Case
from agenttest_worker.engine.assess import run_assertions
from agenttest_worker.engine.documents import final_document
from agenttest_worker.engine.state import ConversationState
from agenttest_worker.results import (
    AgentCallRecord,
    CaseResult,
    Usage,
)


def final_context(case: Case, state: ConversationState, roles: RoleSession) -> AssertionContext:
    """What final_assertions see: the last reply, every tool call, the final document."""
    ran = [t for t in state.turns if t.input is not None]
    return AssertionContext(
        output=ran[-1].output if ran else None,
        document=final_document(state.turns, state.tool_results, state.agent_state),
        tool_calls=[c for t in ran for c in t.tool_calls],
        input=ran[0].input if ran else None,
        messages=state.messages,
        final=True,
        case_id=case.id,
        metadata=dict(case.options.metadata) if case.options else {},
        roles=roles,
    )


async def finish(case: Case, state: ConversationState, pool: AgentPool) -> None:
    """The conversation is complete: run final_assertions."""
    state.phase = "done"
    if not case.final_assertions:
        return
    started = time.monotonic()
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


def case_result(case: Case, state: ConversationState, agent: str | None) -> CaseResult:
    """The case's record: failed if anything failed or errored, else skipped, else passed."""
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
    return CaseResult(
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
    )
