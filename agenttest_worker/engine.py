"""One turn of one conversation: the whole test logic, with no Celery and no database.

The engine is a step function over a serializable ConversationState:

    state = start_conversation(case, session_id)
    while state.phase == "ready":
        state = await run_turn(case, state, pool, options)
    # phase "awaiting_human": call give_human_input(...) with the person's reply or None

A turn sends the pending input with the history to the target, answers tool calls
from `tool_mocks` within the turn, detects whether the agent awaits input, runs the
turn's assertions and chooses the next input: the next static turn (always sent, in
order), else - when the agent awaits input - the simulator, then a person
(interactive), then `on_missing_input`. Limits, errors and statuses follow DESIGN.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from agenttest_worker.agents.base import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.pool import AgentPool, RoleSession
from agenttest_worker.agents.registry import DEFAULT_AWAITING_TOOLS
from agenttest_worker.assertions import Assertion, AssertionContext, evaluate
from agenttest_worker.awaiting import detect_awaiting
from agenttest_worker.cases import Attachment, Case, OnMissingInput
from agenttest_worker.documents import final_document, turn_document
from agenttest_worker.durations import format_duration
from agenttest_worker.options import merge_options
from agenttest_worker.results import (
    AgentCallRecord,
    AssertionResult,
    CaseResult,
    InputSource,
    ToolCall,
    TurnResult,
    Usage,
)

# A target that keeps calling mocked tools is stopped after this many calls in a turn.
MAX_TOOL_ROUNDS = 8
NO_NEXT_TURN = "Agent awaiting input, no next turn defined"
MISSING_INPUT_HINT = "Add more turns, use --interactive, or configure simulator"

Phase = Literal["ready", "awaiting_human", "done"]


class RunOptions(BaseModel):
    """Run-wide choices that shape every conversation (stored with the run)."""

    target: str | None = None
    connector: str | None = None
    on_missing_input: OnMissingInput | None = None
    # True: --interactive; False: --skip-interactive or no terminal to ask at;
    # None: each case's `interactive.enabled` decides.
    interactive: bool | None = None
    case_timeout: float = 300.0
    # A bound on one turn (target, judges, simulator together); None: only the case's.
    turn_timeout: float | None = None
    fail_fast: bool = False
    # Budgets for the whole run: once spent, no new turn starts (--max-tokens/--max-cost).
    max_tokens: int | None = None
    max_cost: float | None = None

    @property
    def budgeted(self) -> bool:
        return self.max_tokens is not None or self.max_cost is not None

    awaiting_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_AWAITING_TOOLS))


class PendingInput(BaseModel):
    text: str
    source: InputSource
    static_index: int | None = None
    simulator_reasoning: str | None = None
    # Time spent producing this input (a simulator call) and the calls made for it,
    # counted in the turn that sends it.
    prep_ms: int = 0
    prep_calls: list[AgentCallRecord] = Field(default_factory=list)


class HumanPrompt(BaseModel):
    question: str | None
    hint: str | None
    asked_at: float


class ConversationState(BaseModel):
    case_id: str
    session_id: str
    phase: Phase = "ready"
    messages: list[dict[str, Any]] = Field(default_factory=list)
    turns: list[TurnResult] = Field(default_factory=list)
    next_input: PendingInput | None = None
    tool_results: dict[str, Any] = Field(default_factory=dict)
    agent_state: Any = None
    error: str | None = None
    skip_reason: str | None = None
    goal_achieved: bool | None = None
    final_assertions: list[AssertionResult] = Field(default_factory=list)
    elapsed_ms: int = 0
    prompt: HumanPrompt | None = None

    @property
    def turns_run(self) -> int:
        return sum(1 for t in self.turns if t.input is not None)


# -- starting ------------------------------------------------------------------------------


def start_conversation(case: Case, session_id: str) -> ConversationState:
    state = ConversationState(case_id=case.id, session_id=session_id)
    # An empty first input is none either (the spec's implementation reads a missing and
    # an empty string alike); a later empty turn is sent as written.
    if not case.turns or case.turns[0].input == "":
        state.error = "no initial input"
        state.phase = "done"
        return state
    state.next_input = PendingInput(text=case.turns[0].input, source="static", static_index=0)
    return state


def target_for(case: Case, options: RunOptions, pool: AgentPool, static_index: int | None) -> str:
    """-c beats a turn's connector, which beats the case's, which beats the case's agent."""
    turn_options = case.turns[static_index].options if static_index is not None else None
    for connector in (
        options.connector,
        turn_options.connector if turn_options else None,
        case.options.connector if case.options else None,
    ):
        if connector and connector in pool.config.agents:
            return connector
    agent = case.agent or options.target
    if agent is None:
        raise AgentError("config", "no target agent: pass -n NAME or set `agent` on the case")
    return agent


# -- one turn ------------------------------------------------------------------------------


def user_message(text: str, attachments: list[Attachment]) -> dict[str, Any]:
    """The user's message; attachments travel as Chat Completions content parts."""
    if not attachments:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for attachment in attachments:
        is_image = attachment.type == "image" or (attachment.mime_type or "").startswith("image/")
        is_image = is_image or attachment.source.startswith("data:image/")
        if is_image:
            parts.append({"type": "image_url", "image_url": {"url": attachment.source}})
        else:
            parts.append(
                {
                    "type": "file",
                    "file": {
                        "filename": attachment.name or "attachment",
                        "file_data": attachment.source,
                    },
                }
            )
    return {"role": "user", "content": parts}


def _tool_content(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def _not_executed(name: str) -> str:
    # Strict Chat Completions APIs require an answer to every tool call before the
    # next message; without a mock the runner says so rather than inventing a result.
    return json.dumps(
        {"status": "not executed", "reason": f"no tool_mocks entry for {name} in the test case"}
    )


async def _call_target(
    case: Case,
    state: ConversationState,
    roles: RoleSession,
    agent: str,
    metadata: dict[str, Any],
    mocks: dict[str, Any],
    turn_no: int,
    client_calls: list[ToolCall],
    answered: dict[str, Any],
) -> AgentReply:
    """Call the target, answering mocked tool calls within the turn (bounded).

    The calls made and the mocked results given are added to `client_calls` and
    `answered` as they happen, so that a turn that ends in an error still records them.
    """
    for round_no in range(MAX_TOOL_ROUNDS):
        reply = await roles.call(
            agent,
            AgentRequest(
                role="target",
                messages=state.messages,
                metadata=metadata,
                session_id=state.session_id,
                case_id=case.id,
                turn=turn_no,
            ),
        )
        assistant = reply.assistant_message()
        state.messages.append(assistant)
        if reply.state is not None:
            state.agent_state = reply.state
        client_calls.extend(reply.tool_calls)
        if not reply.tool_calls:
            return reply
        any_mocked = False
        history_calls = list(assistant.get("tool_calls") or [])
        assistant["tool_calls"] = history_calls
        for index, call in enumerate(reply.tool_calls):
            call_id = call.id or f"call_{turn_no}_{round_no}_{index}"
            # An agent that sends no ids still gets a history where every tool message
            # answers an id of the assistant message (strict APIs check this).
            if index < len(history_calls) and isinstance(history_calls[index], dict):
                history_calls[index] = {**history_calls[index], "id": call_id}
            if call.name in mocks:
                any_mocked = True
                result = mocks[call.name]
                answered[call.name] = result
                state.tool_results[call.name] = result
                content = _tool_content(result)
            else:
                content = _not_executed(call.name)
            state.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        if not any_mocked:
            return reply
    raise AgentError(
        "tool_loop",
        f"agent error: the agent kept calling tools after {MAX_TOOL_ROUNDS} mocked results",
    )


def _turn_spec(case: Case, pending: PendingInput) -> tuple[list[Assertion], list[Attachment]]:
    if pending.static_index is None:
        return [], []
    turn = case.turns[pending.static_index]
    return list(turn.assertions), list(turn.attachments)


def _metadata(case: Case, pending: PendingInput) -> dict[str, Any]:
    turn_options = (
        case.turns[pending.static_index].options if pending.static_index is not None else None
    )
    return dict(merge_options(case.options, turn_options).metadata)


def _mocks(case: Case, pending: PendingInput) -> dict[str, Any]:
    mocks = dict(case.tool_mocks)
    if pending.static_index is not None and case.turns[pending.static_index].tool_mocks:
        mocks.update(case.turns[pending.static_index].tool_mocks or {})
    return mocks


async def run_assertions(
    assertions: list[Assertion], ctx: AssertionContext
) -> list[AssertionResult]:
    outcomes = await asyncio.gather(*(evaluate(a, ctx) for a in assertions))
    results = []
    for spec, outcome in zip(assertions, outcomes, strict=True):
        written = spec.model_dump(mode="json", exclude_unset=True)
        written["type"] = spec.type
        results.append(
            AssertionResult.model_validate(
                {
                    **written,
                    "passed": outcome.passed,
                    "reason": outcome.reason,
                    "score": outcome.score,
                    "suggestions": outcome.suggestions,
                    "error": outcome.error,
                }
            )
        )
    return results


def _remaining(case_timeout: float, state: ConversationState) -> float:
    return case_timeout - state.elapsed_ms / 1000


async def run_turn(
    case: Case,
    state: ConversationState,
    pool: AgentPool,
    options: RunOptions,
    *,
    in_place: bool = False,
) -> ConversationState:
    """Run the pending turn and choose what comes next. Never raises for agent trouble.

    The given state is left as it was (a copy is returned) unless `in_place`: a caller
    that has just loaded the state for this step saves the copy's cost.
    """
    if state.phase != "ready" or state.next_input is None:
        return state
    if not in_place:
        state = state.model_copy(deep=True)
    pending = state.next_input
    assert pending is not None
    state.next_input = None
    turn_no = state.turns_run + 1
    started = time.monotonic()
    log: list[AgentCallRecord] = []
    roles = pool.session(log)
    assertions, attachments = _turn_spec(case, pending)
    turn = TurnResult(
        turn=turn_no,
        input=pending.text,
        input_source=pending.source,
        simulator_reasoning=pending.simulator_reasoning,
    )
    # The simulator call that wrote this turn's input belongs to this turn.
    log.extend(pending.prep_calls)
    state.messages.append(user_message(pending.text, attachments))

    # Everything the turn does (target, tool mocks, judges, the simulator writing the
    # next input) is bounded by what is left of the case's time and by the turn's own
    # limit, in the event loop, whatever pool the worker runs.
    remaining = _remaining(options.case_timeout, state)
    turn_limited = options.turn_timeout is not None and options.turn_timeout < remaining
    budget = options.turn_timeout if turn_limited and options.turn_timeout else remaining
    if turn_limited:
        late = f"timeout after {format_duration(budget)} (the turn's time limit)"
    else:
        late = f"timeout after {format_duration(options.case_timeout)} (the case's time limit)"
    body = _turn_body(case, state, pool, options, roles, turn, pending, assertions, started, log)
    try:
        if budget <= 0:
            body.close()
            raise TimeoutError
        return await asyncio.wait_for(body, timeout=budget)
    except TimeoutError:
        if any(recorded is turn for recorded in state.turns):
            # The turn itself was recorded; what timed out came after it (a judge's or the
            # simulator's call): the case fails with the reason.
            state.next_input = None
            state.error = late
            state.phase = "done"
            return state
        turn.error = late
        return _end_turn_with_error(state, turn, started, pending, log)


async def _turn_body(
    case: Case,
    state: ConversationState,
    pool: AgentPool,
    options: RunOptions,
    roles: RoleSession,
    turn: TurnResult,
    pending: PendingInput,
    assertions: list[Assertion],
    started: float,
    log: list[AgentCallRecord],
) -> ConversationState:
    calls: list[ToolCall] = []
    answered: dict[str, Any] = {}
    try:
        agent = target_for(case, options, pool, pending.static_index)
        reply = await _call_target(
            case,
            state,
            roles,
            agent,
            _metadata(case, pending),
            _mocks(case, pending),
            turn.turn,
            calls,
            answered,
        )
    except AgentError as exc:
        turn.error = exc.message
        # What the agent did before the error is part of the turn's record.
        turn.tool_calls = calls
        turn.tool_results = answered or None
        return _end_turn_with_error(state, turn, started, pending, log)

    turn.output = reply.content if reply.content is not None else ""
    turn.tool_calls = calls
    turn.tool_results = answered or None
    turn.input_hint = reply.input_hint
    # Only the final reply's tool calls say whether the agent now waits: a mocked
    # request_confirmation earlier in the turn was answered by the mock.
    awaiting = detect_awaiting(
        reply.content, reply.tool_calls, reply.awaiting_input, options.awaiting_tools
    )
    turn.awaiting_input, turn.awaiting_reason = awaiting.awaiting, awaiting.reason

    ctx = AssertionContext(
        output=turn.output,
        document=turn_document(turn.output, calls),
        tool_calls=calls,
        input=pending.text,
        messages=state.messages,
        final=False,
        case_id=case.id,
        metadata=_metadata(case, pending),
        roles=roles,
    )
    turn.assertions = await run_assertions(assertions, ctx)
    turn.status = "passed" if all(a.passed for a in turn.assertions) else "failed"
    _close_turn(state, turn, started, pending, log)
    await _choose_next(case, state, pool, options, awaiting.awaiting, pending)
    return state


def _close_turn(
    state: ConversationState,
    turn: TurnResult,
    started: float,
    pending: PendingInput,
    log: list[AgentCallRecord],
) -> None:
    turn.duration_ms = int((time.monotonic() - started) * 1000) + pending.prep_ms
    turn.calls = log or None
    usage = [c.usage for c in log if c.usage is not None]
    turn.usage = sum(usage, Usage()) if usage else None
    state.elapsed_ms += turn.duration_ms
    state.turns.append(turn)


def _end_turn_with_error(
    state: ConversationState,
    turn: TurnResult,
    started: float,
    pending: PendingInput,
    log: list[AgentCallRecord],
) -> ConversationState:
    # Without a reply there is nothing to build the next turn on: the case fails here.
    turn.status = "failed"
    _close_turn(state, turn, started, pending, log)
    state.phase = "done"
    return state


# -- what comes next ---------------------------------------------------------------------


def wants_human(case: Case, options: RunOptions) -> bool:
    if options.interactive is not None:
        return options.interactive
    return bool(case.interactive and case.interactive.enabled)


def _on_missing(case: Case, options: RunOptions) -> OnMissingInput:
    return options.on_missing_input or case.on_missing_input or "skip"


async def _choose_next(
    case: Case,
    state: ConversationState,
    pool: AgentPool,
    options: RunOptions,
    awaiting: bool,
    pending: PendingInput,
) -> None:
    limit = case.limit_turns()
    done_turns = state.turns_run
    next_static = (pending.static_index + 1) if pending.static_index is not None else None
    if next_static is not None and next_static < len(case.turns):
        if done_turns >= limit:
            _fail(state, f"max turns ({limit}) exceeded")
            return
        state.next_input = PendingInput(
            text=case.turns[next_static].input, source="static", static_index=next_static
        )
        return
    if not awaiting:
        await finish(case, state, pool)
        return
    ask_human = wants_human(case, options)
    has_source = case.simulator is not None or ask_human
    if has_source and done_turns >= limit:
        _fail(state, f"max turns ({limit}) exceeded")
        return
    if case.simulator is not None:
        await _simulate_next(case, state, pool, limit)
        return
    if ask_human:
        last = state.turns[-1]
        state.phase = "awaiting_human"
        state.prompt = HumanPrompt(question=last.output, hint=last.input_hint, asked_at=time.time())
        return
    await apply_missing_input(case, state, pool, options)


async def _simulate_next(case: Case, state: ConversationState, pool: AgentPool, limit: int) -> None:
    assert case.simulator is not None
    started = time.monotonic()
    log: list[AgentCallRecord] = []
    metadata = {
        "test_mode": "simulator",
        "test_id": case.id,
        **case.simulator.effective_metadata(),
        "turn_number": state.turns_run + 1,
        "max_turns": limit,
        "session_id": state.session_id,
        "tool_results": state.tool_results,
    }
    simulator_options = case.simulator.options
    # Filled in when the run was submitted; the run's config decides otherwise.
    use = case.simulator.use or pool.config.defaults.simulator or ""
    if simulator_options and simulator_options.connector in pool.config.agents:
        use = f"agents:{simulator_options.connector}"
    try:
        if not use:
            raise AgentError("config", "no simulator named (simulator.use, defaults.simulator)")
        sim = await pool.session(log).simulate(
            use,
            state.messages,
            metadata,
            session_id=state.session_id,
            case_id=case.id,
            turn=state.turns_run + 1,
        )
    except AgentError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        skipped = TurnResult(
            turn=state.turns_run + 1,
            input=None,
            input_source="simulator",
            status="skipped",
            skip_reason=f"simulator error: {exc.message}",
            duration_ms=elapsed,
            calls=log or None,
        )
        state.elapsed_ms += elapsed
        state.turns.append(skipped)
        state.skip_reason = skipped.skip_reason
        state.phase = "done"
        return
    prep_ms = int((time.monotonic() - started) * 1000)
    if sim.goal_achieved:
        # No turn follows: the call that ended the conversation is counted in the last
        # turn (the reply it judged), so that turn durations still add up to the case's.
        state.goal_achieved = True
        last = state.turns[-1]
        last.simulator_reasoning = sim.reasoning or last.simulator_reasoning
        last.duration_ms += prep_ms
        last.calls = [*(last.calls or []), *log] or None
        usage = [c.usage for c in last.calls or [] if c.usage is not None]
        last.usage = sum(usage, Usage()) if usage else None
        state.elapsed_ms += prep_ms
        await finish(case, state, pool)
        return
    state.goal_achieved = False
    state.next_input = PendingInput(
        text=sim.input,
        source="simulator",
        simulator_reasoning=sim.reasoning,
        prep_ms=prep_ms,
        prep_calls=log,
    )


async def give_human_input(
    case: Case,
    state: ConversationState,
    text: str | None,
    pool: AgentPool,
    options: RunOptions,
    reason: str | None = None,
) -> ConversationState:
    """Resume a conversation parked for a person: their reply, or None when none came."""
    if state.phase != "awaiting_human":
        return state
    state = state.model_copy(deep=True)
    state.phase = "ready"
    state.prompt = None
    if text is not None:
        state.next_input = PendingInput(text=text, source="interactive")
        return state
    await apply_missing_input(case, state, pool, options, reason)
    return state


async def apply_missing_input(
    case: Case,
    state: ConversationState,
    pool: AgentPool,
    options: RunOptions,
    reason: str | None = None,
) -> None:
    why = reason or NO_NEXT_TURN
    policy = _on_missing(case, options)
    if policy == "end":
        await finish(case, state, pool)
        return
    if policy == "fail":
        _fail(state, f"{why} (on_missing_input: fail)")
        return
    state.turns.append(
        TurnResult(turn=state.turns_run + 1, input=None, status="skipped", skip_reason=why)
    )
    state.skip_reason = why
    state.phase = "done"


def _fail(state: ConversationState, error: str) -> None:
    state.error = error
    state.phase = "done"


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
    )
