"""A conversation as data: the run's options, the pending input, the serializable state.

Everything the engine needs between two turns lives in ConversationState, so a worker
can save it after a turn and any other worker can load it and play the next.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from agenttest_worker.agents.config import DEFAULT_AWAITING_TOOLS
from agenttest_worker.cases.case_model import Case, OnMissingInput
from agenttest_worker.json_values import compact_json
from agenttest_worker.observe.tracing import ConversationTrace
from agenttest_worker.results import (
    AgentCallRecord,
    AssertionResult,
    InputSource,
    TurnResult,
)

# A target that keeps calling mocked tools is stopped after this many calls in a turn.
MAX_TOOL_ROUNDS = 8
NO_NEXT_TURN = "Agent awaiting input, no next turn defined"
NO_INITIAL_INPUT = "no initial input"
BLANK_INITIAL_INPUT = f"{NO_INITIAL_INPUT}: the first input is blank (empty or whitespace only)"
# How the error of a case `on_missing_input: fail` ended ends, and how a simulator's
# failure and the turn bound begin: engine/attribution.py tells causes by them.
MISSING_INPUT_FAILS = "(on_missing_input: fail)"
SIMULATOR_ERROR = "simulator error: "
MAX_TURNS_EXCEEDED = "max turns ("
MISSING_INPUT_HINT = (
    "Add more turns, use --interactive, configure simulator, or set on_missing_input: end"
)

Phase = Literal["ready", "awaiting_human", "done"]


DEFAULT_MAX_CONVERSATION_BYTES = 32 * 1024 * 1024


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
    # Repeats (--repeat, --pass-rule, --pass-k): how often each case is played, and how
    # the reports turn its repetitions into one verdict (report/verdicts.py).
    repeat: int | None = None
    # --repeat auto: `repeat` is the most a case is played (repeat_stopping.py).
    repeat_auto: bool = False
    pass_rule: str = "all"
    pass_k: int | None = None
    # How many cases the run's conversations play, when some case is played more than
    # once (the header says "3 test cases × 5 repetitions"); None: one conversation each.
    distinct_cases: int | None = None
    # What one conversation's inputs and replies may add up to, in UTF-8 bytes: each turn
    # sends the agent the whole conversation, and every process playing it holds it.
    max_conversation_bytes: int = DEFAULT_MAX_CONVERSATION_BYTES
    # The reply cache (agents/reply_cache.py): "off" (--no-cache), "refresh"
    # (--cache-refresh: call again and keep the new reply), and targets cached too
    # (--cache target).
    cache: Literal["on", "off", "refresh"] = "on"
    cache_target: bool = False

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
    # The end state last read from the agent's `state:` URL (engine/end_state.py); left
    # out while None, so that states stored before it read the same.
    end_state: Any = Field(default=None, exclude_if=lambda value: value is None)
    error: str | None = None
    skip_reason: str | None = None
    goal_achieved: bool | None = None
    final_assertions: list[AssertionResult] = Field(default_factory=list)
    elapsed_ms: int = 0
    prompt: HumanPrompt | None = None
    # The UTF-8 bytes of the inputs and replies so far (RunOptions.max_conversation_bytes);
    # left out while 0, so that states stored before it read the same.
    conversation_bytes: int = Field(default=0, exclude_if=lambda value: value == 0)
    # With a store that keeps turn records (driver/state_cache.py): `turns` holds the
    # turns after the first `earlier_turns`, whose results are stored apart, one row
    # each, and `earlier_run` of those had an input. A step plays on such a state: only
    # the end of the conversation reads the earlier turns (`restore_turns`: its final
    # assertions, its record), which stay until then the text they were stored as,
    # `earlier_records`, in this process's memory only. Both counts are left out when
    # None, so that a whole state is written as it always was.
    earlier_turns: int | None = Field(default=None, exclude_if=lambda value: value is None)
    earlier_run: int | None = Field(default=None, exclude_if=lambda value: value is None)
    # JSON arrays of the earlier turns' results, in order (never stored).
    earlier_records: tuple[str, ...] = Field(default=(), exclude=True)
    # With turn records too: how many of the first `messages` are stored apart, with the
    # turn records (a conversation's messages only grow: a step writes the new ones once
    # instead of the whole conversation again). In memory `messages` holds them all, as
    # its agent is sent them; the stored state holds those after the first
    # `earlier_messages`. None (left out) when the state stores every message.
    earlier_messages: int | None = Field(default=None, exclude_if=lambda value: value is None)
    # The conversation's trace (observe/tracing.py): drawn when its first turn is played,
    # so that every turn, on whatever worker, continues it; left out while None.
    trace: ConversationTrace | None = Field(default=None, exclude_if=lambda value: value is None)

    @property
    def turns_run(self) -> int:
        return (self.earlier_run or 0) + sum(1 for t in self.turns if t.input is not None)

    def restore_turns(self) -> None:
        """Put the earlier turns back in `turns`, read from `earlier_records`: what the
        end of a conversation reads. A no-op on a state that holds every turn.

        LookupError when the records do not hold as many turns as the state counts (a
        store that did not hand them back)."""
        # Whole again: its messages are all in memory, and all stored with it from now.
        self.earlier_messages = None
        count = self.earlier_turns
        if count is None:
            return
        earlier = [turn for text in self.earlier_records for turn in _TURNS.validate_json(text)]
        if len(earlier) != count:
            raise LookupError(
                f"conversation {self.case_id}: its state holds its turns after the first "
                f"{count}, and {len(earlier)} earlier turns were loaded"
            )
        self.turns[:0] = earlier
        self.earlier_turns = self.earlier_run = None
        self.earlier_records = ()

    def stored_json(self) -> str:
        """The state's JSON text as stored: `model_dump_json`'s document, its messages
        first and written by orjson. They are the conversation as its agent is sent it,
        stored with every step, the part of a state that grows with each turn: pydantic
        wrote them ~2.5x slower (benchmarks/long_conversation.py). Only those after the
        first `earlier_messages`, which are stored apart."""
        apart = self.earlier_messages
        stored = self.messages[apart:] if apart else self.messages
        messages = compact_json(stored)
        if messages is None:
            if not apart:
                return self.model_dump_json()
            return self.model_copy(update={"messages": stored}).model_dump_json()
        rest = self.model_dump_json(exclude=_MESSAGES)
        return '{"messages":' + messages.decode() + "," + rest[1:]


_TURNS: TypeAdapter[list[TurnResult]] = TypeAdapter(list[TurnResult])
_MESSAGES = {"messages"}


# -- starting ------------------------------------------------------------------------------


def start_conversation(case: Case, session_id: str) -> ConversationState:
    state = ConversationState(case_id=case.id, session_id=session_id)
    # A blank first input (empty, or whitespace only) is none either: the spec's "no
    # initial input", with why; a later blank turn is sent as written.
    if not case.turns or not case.turns[0].input.strip():
        state.error = NO_INITIAL_INPUT if not case.turns else BLANK_INITIAL_INPUT
        state.phase = "done"
        return state
    state.next_input = PendingInput(text=case.turns[0].input, source="static", static_index=0)
    return state
