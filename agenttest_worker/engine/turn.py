"""One turn: send the pending input to the target, answer mocked tool calls, detect
whether the agent awaits input, run the turn's assertions and choose the next input.

A streamed reply's time to first token and the target's whole reply time are kept on
the turn (and given to latency assertions); a stream that broke after content arrived
leaves that content as the turn's output. A history-based agent's reply is read from
its chat history (engine/history_turns.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest, history_source
from agenttest_worker.agents.options import Options, merge_options
from agenttest_worker.agents.pool import AgentPool, RoleSession
from agenttest_worker.assertions import Assertion, TimedContext
from agenttest_worker.cases.case_model import Attachment, Case
from agenttest_worker.durations import format_duration
from agenttest_worker.engine.assess import grade_turn, run_assertions
from agenttest_worker.engine.awaiting import detect_awaiting
from agenttest_worker.engine.documents import turn_document
from agenttest_worker.engine.end_state import after_turn, turn_document_with_state
from agenttest_worker.engine.history_turns import more_static, read_rounds
from agenttest_worker.engine.next_input import choose_next
from agenttest_worker.engine.state import (
    MAX_TOOL_ROUNDS,
    ConversationState,
    PendingInput,
    RunOptions,
)
from agenttest_worker.results import (
    AgentCallRecord,
    ToolCall,
    TurnResult,
    Usage,
)


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


@dataclass(frozen=True)
class _TargetCall:
    """What the turn sends the target besides the history: who, with what metadata and
    options (the case's merged with the turn's), and which tool calls are mocked."""

    agent: str
    metadata: dict[str, Any]
    options: dict[str, Any]
    params: dict[str, Any]
    mocks: dict[str, Any]


@dataclass
class _TargetWork:
    """What the target did in the turn, kept as it happens so that a turn that ends in
    an error still records it: the tool calls, the mocked results given, and what in
    its replies could not be used (malformed tool calls)."""

    calls: list[ToolCall] = field(default_factory=list)
    answered: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # Milliseconds from the input sent to the first piece of streamed content, and to
    # the end of the target's final reply (or its failure).
    first_token_ms: int | None = None
    response_ms: int | None = None
    # What a stream that broke had sent: the turn's output.
    partial: str | None = None

    def record_on(self, turn: TurnResult) -> None:
        turn.tool_calls = self.calls
        turn.tool_results = self.answered or None
        turn.problems = self.problems or None
        if self.first_token_ms is not None:  # a streamed turn: both times are kept
            turn.first_token_ms = self.first_token_ms
            turn.response_ms = self.response_ms
        if self.partial is not None:
            turn.output = self.partial

    def timed(self, sent: float, call_started: float, call: AgentCallRecord | None) -> None:
        if self.first_token_ms is None and call is not None and call.first_token_ms is not None:
            self.first_token_ms = int((call_started - sent) * 1000) + call.first_token_ms
        self.response_ms = int((time.monotonic() - sent) * 1000)


async def _call_target(
    case: Case,
    state: ConversationState,
    roles: RoleSession,
    target: _TargetCall,
    turn_no: int,
    work: _TargetWork,
) -> AgentReply:
    """Call the target, answering mocked tool calls within the turn (bounded)."""
    sent = time.monotonic()
    for round_no in range(MAX_TOOL_ROUNDS):
        call_started = time.monotonic()
        try:
            reply = await roles.call(target.agent, _target_request(case, state, target, turn_no))
        except AgentError as exc:
            work.timed(sent, call_started, exc.call)
            if exc.partial is not None:
                # The stream broke after content came: what came is the turn's output.
                work.partial = exc.partial.content or ""
                work.calls.extend(exc.partial.tool_calls)
                work.problems.extend(exc.partial.problems)
            raise
        work.timed(sent, call_started, reply.call)
        assistant = reply.assistant_message()
        state.messages.append(assistant)
        if reply.state is not None:
            state.agent_state = reply.state
        work.calls.extend(reply.tool_calls)
        work.problems.extend(reply.problems)
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
            if call.name in target.mocks:
                any_mocked = True
                result = target.mocks[call.name]
                work.answered[call.name] = result
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


def _target_request(
    case: Case, state: ConversationState, target: _TargetCall, turn_no: int
) -> AgentRequest:
    return AgentRequest(
        role="target",
        messages=state.messages,
        metadata=target.metadata,
        options=target.options,
        params=target.params,
        session_id=state.session_id,
        case_id=case.id,
        turn=turn_no,
        repetition=case.repetition,
    )


def _turn_spec(case: Case, pending: PendingInput) -> tuple[list[Assertion], list[Attachment]]:
    if pending.static_index is None:
        return [], []
    turn = case.turns[pending.static_index]
    return list(turn.assertions), list(turn.attachments)


def _options(case: Case, pending: PendingInput) -> Options:
    """The case's options merged with the static turn's (case < turn)."""
    turn_options = (
        case.turns[pending.static_index].options if pending.static_index is not None else None
    )
    return merge_options(case.options, turn_options)


def _mocks(case: Case, pending: PendingInput) -> dict[str, Any]:
    mocks = dict(case.tool_mocks)
    if pending.static_index is not None and case.turns[pending.static_index].tool_mocks:
        mocks.update(case.turns[pending.static_index].tool_mocks or {})
    return mocks


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
    body = _turn_body(case, state, pool, options, roles, turn, pending, assertions, started, log)
    try:
        if budget <= 0:
            body.close()
            raise TimeoutError
        # asyncio.timeout, not wait_for: the body runs in this task instead of a new one
        # (a task, its context and its waiter per turn in flight, thousands on a fleet).
        async with asyncio.timeout(budget):
            return await body
    except TimeoutError:
        # (Written here, not before the call: a turn waiting on its agent holds no text
        # it will most likely never show.)
        if turn_limited:
            late = f"timeout after {format_duration(budget)} (the turn's time limit)"
        else:
            late = f"timeout after {format_duration(options.case_timeout)} (the case's time limit)"
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
    work = _TargetWork()
    sent = _options(case, pending)
    try:
        target = _TargetCall(
            agent=target_for(case, options, pool, pending.static_index),
            metadata=dict(sent.metadata),
            options=sent.for_agent(),
            params=sent.params,
            mocks=_mocks(case, pending),
        )
        reply = await _call_target(case, state, roles, target, turn.turn, work)
    except AgentError as exc:
        turn.error = exc.message
        # What the agent did before the error is part of the turn's record.
        work.record_on(turn)
        return _end_turn_with_error(state, turn, started, pending, log)

    turn.output = reply.content if reply.content is not None else ""
    work.record_on(turn)
    if (passed := _past_conversation_bound(state, turn, options)) is not None:
        turn.error = passed
        return _end_turn_with_error(state, turn, started, pending, log)
    turn.input_hint = reply.input_hint
    content, final_calls = reply.content, reply.tool_calls
    # (target_for and the first call resolved the client: this cannot fail here.)
    source = history_source(pool.client(target.agent))
    held = source is not None and source.history_when == "end"
    held = held and more_static(case, pending.static_index)
    read = []
    if source is not None and not held:
        request = _target_request(case, state, target, turn.turn)
        try:
            read = await read_rounds(case, state, source, request, turn, log)
        except AgentError as exc:
            turn.error = exc.message
            return _end_turn_with_error(state, turn, started, pending, log)
        content, final_calls = turn.output, turn.tool_calls
    # Only the final reply's tool calls say whether the agent now waits: a mocked
    # request_confirmation earlier in the turn was answered by the mock.
    turn.finish_reason = reply.finish_reason
    awaiting = detect_awaiting(
        content, final_calls, reply.awaiting_input, options.awaiting_tools, reply.finish_reason
    )
    turn.awaiting_input, turn.awaiting_reason = awaiting.awaiting, awaiting.reason
    # With `state: {each_turn: true}`, its assertions read the state the turn left.
    if (unread := await after_turn(case, state, pool, target.agent, turn)) is not None:
        turn.error = unread
        return _end_turn_with_error(state, turn, started, pending, log)

    metadata = dict(sent.metadata)
    if held:
        # Its reply is read from the history after the last static turn; its assertions
        # are run then.
        grade_turn(turn, [])
    elif not read:
        ctx = _context(case, turn, state.messages, metadata, roles, work.response_ms)
        grade_turn(turn, await run_assertions(assertions, ctx))
    for done in read:
        if done.turn is turn:
            ctx = _context(case, turn, done.messages, metadata, roles, work.response_ms)
            grade_turn(turn, await run_assertions(assertions, ctx))
            continue
        index = done.static_index
        specs = list(case.turns[index].assertions) if index is not None else []
        ctx = _context(case, done.turn, done.messages, metadata, roles, None)
        grade_turn(done.turn, await run_assertions(specs, ctx))
    _close_turn(state, turn, started, pending, log)
    await choose_next(case, state, pool, options, awaiting.awaiting, pending)
    return state


def _context(
    case: Case,
    turn: TurnResult,
    messages: list[dict[str, Any]],
    metadata: dict[str, Any],
    roles: RoleSession,
    response_ms: int | None,
) -> TimedContext:
    """What the turn's assertions see; a history-based turn's events are in its document.

    `response_ms`: the target's time in the turn; None for an earlier turn judged late
    (`history: {when: end}`), whose own record says it.
    """
    output = turn.output if turn.output is not None else ""
    document = turn_document_with_state(turn_document(output, turn.tool_calls), turn)
    if turn.events is not None and isinstance(document, dict) and "events" not in document:
        document = {**document, "events": turn.events}
    if response_ms is None:
        response_ms = turn.response_ms
    if response_ms is None:
        targets = [c.latency_ms for c in turn.calls or [] if c.role == "target"]
        response_ms = sum(targets) if targets else None
    return TimedContext(
        output=output,
        document=document,
        tool_calls=turn.tool_calls,
        input=turn.input,
        messages=messages,
        final=False,
        case_id=case.id,
        metadata=metadata,
        roles=roles,
        first_token_ms=turn.first_token_ms,
        response_ms=response_ms,
    )


def _past_conversation_bound(
    state: ConversationState, turn: TurnResult, options: RunOptions
) -> str | None:
    """Counts the turn's input and reply into the conversation's size; the reason the
    turn fails when that passes `max_conversation_bytes`, else None."""
    text = (turn.input or "") + (turn.output or "")
    added = len(text.encode("utf-8", "replace"))
    state.conversation_bytes += added
    bound = options.max_conversation_bytes
    if state.conversation_bytes <= bound:
        return None
    return (
        f"the conversation passed its bound of {bound:,} bytes (max_conversation_bytes) "
        f"at turn {turn.turn}: {state.conversation_bytes:,} bytes of inputs and replies"
    )


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
