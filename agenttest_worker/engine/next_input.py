"""What comes after a turn: the next static turn, the simulator, a person, or
`on_missing_input` (DESIGN.md decisions 1-4)."""

from __future__ import annotations

import time

from agenttest_worker.agents.interface import AgentError
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.cases.case_model import Case, OnMissingInput
from agenttest_worker.engine.outcome import finish
from agenttest_worker.engine.state import (
    MAX_TURNS_EXCEEDED,
    MISSING_INPUT_FAILS,
    NO_NEXT_TURN,
    SIMULATOR_ERROR,
    ConversationState,
    HumanPrompt,
    PendingInput,
    RunOptions,
)
from agenttest_worker.results import (
    AgentCallRecord,
    TurnResult,
    Usage,
)


def wants_human(case: Case, options: RunOptions) -> bool:
    if options.interactive is not None:
        return options.interactive
    return bool(case.interactive and case.interactive.enabled)


def missing_input_policy(
    case: Case, options: RunOptions, project_default: OnMissingInput | None
) -> OnMissingInput:
    """What an agent awaiting input with nothing to answer it leads to (DESIGN.md
    decision 3): the run's `--on-missing-input`, else the case's own, else agenttest.yaml's
    `defaults.on_missing_input`, else the case's form: a single-turn case is over after
    its turn (`end`), a multi-turn one is missing its next input (`skip`)."""
    chosen = options.on_missing_input or case.on_missing_input or project_default
    if chosen is not None:
        return chosen
    return "end" if case.type == "single_turn" else "skip"


async def choose_next(
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
            _fail(state, f"{MAX_TURNS_EXCEEDED}{limit}) exceeded")
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
        _fail(state, f"{MAX_TURNS_EXCEEDED}{limit}) exceeded")
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
        # The spec's context names the same number turn_count.
        "turn_count": state.turns_run + 1,
        "max_turns": limit,
        "last_response": state.turns[-1].output or "",
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
            params=simulator_options.params if simulator_options else {},
            repetition=case.repetition,
        )
        if sim.left_persona:
            # Its own reply says the conversation stopped testing what the case meant.
            said = f": {sim.reasoning}" if sim.reasoning else ""
            raise AgentError("parse", f"{use} left its persona{said}")
    except AgentError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        skipped = TurnResult(
            turn=state.turns_run + 1,
            input=None,
            input_source="simulator",
            status="skipped",
            skip_reason=f"{SIMULATOR_ERROR}{exc.message}",
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
    policy = missing_input_policy(case, options, pool.config.defaults.on_missing_input)
    if policy == "end":
        await finish(case, state, pool)
        return
    if policy == "fail":
        _fail(state, f"{why} {MISSING_INPUT_FAILS}")
        return
    state.turns.append(
        TurnResult(turn=state.turns_run + 1, input=None, status="skipped", skip_reason=why)
    )
    state.skip_reason = why
    state.phase = "done"


def _fail(state: ConversationState, error: str) -> None:
    state.error = error
    state.phase = "done"
