"""The result model: one CaseResult per case = one line of the JSONL report.

The shape follows the spec's "JSONL Output" record (id, name, status, turns[],
final_assertions, total_turns, duration_ms) with DESIGN.md's additions. `version`
lets readers of stored reports tell record layouts apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

RESULT_VERSION = 1
# The error of a case its run's --deadline ended (driver/step.py): the reports tell a
# run stopped by its deadline by it.
DEADLINE_PASSED = "run deadline passed before this case finished"

CaseStatus = Literal["passed", "failed", "skipped"]
TurnStatus = Literal["passed", "failed", "skipped"]
InputSource = Literal["static", "simulator", "interactive"]
AgentRole = Literal["target", "simulator", "validator", "generator", "reporter"]
# Why a case failed or was skipped (engine/attribution.py, report/causes.py).
Cause = Literal["agent", "judge", "simulator", "infrastructure", "flake", "input"]
CAUSES: tuple[Cause, ...] = ("agent", "judge", "simulator", "infrastructure", "flake", "input")


@dataclass(frozen=True)
class AssertionOutcome:
    """What a checker concluded. `reason` is written for the person reading the report.

    A judge asked more than once, or a panel of judges, gives every vote and the share
    of them that agrees with the verdict (`agreement`)."""

    passed: bool
    reason: str
    score: float | None = None
    suggestions: list[str] | None = None
    error: str | None = None
    votes: list[JudgeVote] | None = None
    agreement: float | None = None
    # What a judge said beside its verdict (tdx's evaluator): how it went about judging,
    # and its reasoning.
    plan: str | None = None
    thinking: str | None = None
    # What the judge was sent (its messages as text) and what it answered, as it said
    # it, so that a reader can check a verdict against both.
    judge_prompt: str | None = None
    judge_reply: str | None = None


class _Record(BaseModel):
    """Records leave out their optional fields when unset: `error?`, `skip_reason?`, ...

    Only declared fields that default to None are left out, and not those in
    `_keep_none` (a skipped turn still says `"input": null`); extra keys (an
    assertion's own fields, like a json_path `"value": null`) are kept as written.
    """

    model_config = ConfigDict(extra="forbid")
    _keep_none: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Marked once per class and serialized by pydantic-core: a Python serializer
        # wrapping every record was a visible share of each turn's CPU.
        super().__pydantic_init_subclass__(**kwargs)
        changed = False
        for name, field in cls.model_fields.items():
            if field.default is None and name not in cls._keep_none and field.exclude_if is None:
                field.exclude_if = _is_none
                changed = True
        if changed:
            cls.model_rebuild(force=True)


def _is_none(value: Any) -> bool:
    return value is None


class ToolCall(_Record):
    """A tool call the agent made: name and parsed arguments (raw text when not JSON)."""

    name: str
    args: Any = Field(default_factory=dict)
    id: str | None = None


class Usage(_Record):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class AgentCallRecord(_Record):
    """One call to an agent (target, simulator, judge, ...): what it cost and how it went."""

    role: AgentRole
    agent: str
    latency_ms: int
    attempts: int = 1
    status_code: int | None = None
    usage: Usage | None = None
    error: str | None = None
    # The reply's raw text (its first 4,096 characters) when it could not be used: not
    # JSON, an HTTP error's body, a role reply without what the role must return.
    reply: str | None = None
    # A streamed reply: milliseconds from the call's start (retries included, as in
    # latency_ms) to its first piece of content; absent for a reply read whole.
    first_token_ms: int | None = None
    # Why the agent stopped, as it said (a stream's finish_reason, Anthropic's
    # stop_reason: end_turn, tool_use, max_tokens, ...); absent when it said nothing.
    stop_reason: str | None = None
    # True: the reply was served from the reply cache; the agent was not called and
    # the call used nothing.
    cached: bool | None = None


class JudgeVote(_Record):
    """One judge's answer to one asking: who, what it decided, its score and reason
    (`error` when the call failed: such a vote is not a pass)."""

    judge: str
    passed: bool
    score: float | None = None
    reason: str = ""
    error: str | None = None


class AssertionResult(_Record):
    """An assertion as written in the case, plus its verdict and a reason a person can act on.

    The spec fields of the assertion (type, value, pattern, path, name, ...) are kept as
    written so a report shows exactly what was checked.
    """

    model_config = ConfigDict(extra="allow")

    type: str
    passed: bool
    reason: str = ""
    score: float | None = None
    suggestions: list[str] | None = None
    error: str | None = None
    # An agent assertion asked with `votes` or a panel of judges (`use: [...]`).
    votes: list[JudgeVote] | None = None
    agreement: float | None = None
    # A judge's plan and thinking beside its verdict (tdx's evaluator), when it gave them.
    plan: str | None = None
    thinking: str | None = None
    # A judge's prompt and raw reply (in a panel, those of the judge whose reason is given).
    judge_prompt: str | None = None
    judge_reply: str | None = None


class TurnResult(_Record):
    # Fields of the spec's turn record: present (null) even when there is no value, like
    # the input and source of a turn skipped for want of input.
    _keep_none: ClassVar[frozenset[str]] = frozenset({"input", "input_source", "output"})

    turn: int
    input: str | None = None
    input_source: InputSource | None = None
    output: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_results: dict[str, Any] | None = None
    awaiting_input: bool = False
    awaiting_reason: str | None = None
    # Why the target's final reply of the turn stopped, as its protocol said it (OpenAI's
    # finish_reason: stop, length, tool_calls; Anthropic's stop_reason: end_turn,
    # max_tokens, tool_use; an http agent's `finish_reason` path); absent when unsaid.
    finish_reason: str | None = None
    input_hint: str | None = None
    assertions: list[AssertionResult] = Field(default_factory=list)
    status: TurnStatus = "passed"
    duration_ms: int = 0
    error: str | None = None
    skip_reason: str | None = None
    simulator_reasoning: str | None = None
    usage: Usage | None = None
    calls: list[AgentCallRecord] | None = None
    # The failing assertions' reasons, in order (the spec's error table: a failed
    # assertion gives `assertion_errors: [...]`); absent when none failed.
    assertion_errors: list[str] | None = None
    # What in the agent's reply could not be used as it came, each quoting the raw text
    # (malformed tool calls); such a turn fails, and the conversation goes on.
    problems: list[str] | None = None
    # A streamed turn: milliseconds from the input sent to the target's first piece of
    # content, and to the end of its final reply (mocked tool rounds included; unlike
    # duration_ms, no judge or simulator time). Absent for turns read whole.
    first_token_ms: int | None = None
    response_ms: int | None = None
    # A history-based agent (`history:` in agenttest.yaml): everything it emitted after
    # this turn's input, in order, as its chat history wrote it (several assistant
    # messages, tool calls and results). Absent for other agents.
    events: list[Any] | None = None
    # The state the agent left in its system after this turn (`state: {each_turn: true}`),
    # as its end state URL answered it; absent otherwise.
    end_state: Any = None


class RoleUsage(_Record):
    """What one role's calls cost: calls, tokens and `cost` (from each agent's
    `pricing` in agenttest.yaml; 0 for agents without one)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost: float = 0.0
    # How many of `calls` were served from the reply cache (used nothing); absent: none.
    cached: int | None = None

    def __add__(self, other: RoleUsage) -> RoleUsage:
        cached = (self.cached or 0) + (other.cached or 0)
        return RoleUsage(
            calls=self.calls + other.calls,
            cached=cached or None,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=round(self.cost + other.cost, COST_DIGITS),
        )


# Sums of per-call costs carry float noise (0.30000000000000004): costs are rounded so.
COST_DIGITS = 9

# The roles usage is split by, as `usage_by_role` names them (a validator is the judge).
UsageRole = Literal["target", "simulator", "judge", "generator", "reporter"]


def add_usage(
    total: dict[UsageRole, RoleUsage], more: Mapping[UsageRole, RoleUsage]
) -> dict[UsageRole, RoleUsage]:
    """Add `more` into `total` by role (changed in place, and returned)."""
    for role, found in more.items():
        had = total.get(role)
        total[role] = found if had is None else had + found
    return total


def usage_spend(usage: Mapping[UsageRole, RoleUsage]) -> tuple[int, float]:
    """(tokens, cost) of `usage`, every role's together."""
    return sum(u.total_tokens for u in usage.values()), sum(u.cost for u in usage.values())


class CaseResult(_Record):
    # The spec's record always has a name (null for a case that has none).
    _keep_none: ClassVar[frozenset[str]] = frozenset({"name"})

    version: int = RESULT_VERSION
    id: str
    name: str | None = None
    status: CaseStatus
    agent: str | None = None
    turns: list[TurnResult] = Field(default_factory=list)
    final_assertions: list[AssertionResult] = Field(default_factory=list)
    total_turns: int = 0
    duration_ms: int = 0
    error: str | None = None
    skip_reason: str | None = None
    goal_achieved: bool | None = None
    simulator: str | None = None
    tags: list[str] | None = None
    usage: Usage | None = None
    # Where the case is written (the case file as given to -i, and the case's line), so
    # that CI annotations point at it; absent for cases from a message or a generator.
    file: str | None = None
    line: int | None = None
    # A case played K times (`--repeat K`, a case's `repeat`): which repetition this
    # record is (1-based) and K; absent for a case played once.
    repeat: int | None = None
    repeats: int | None = None
    # Played with `--repeat auto`: the most repetitions it could take (--max-repeat);
    # then `repeats` is how many were played and `stop_reason` why no more were
    # ("decided", "max_repeat", "stopped"), both filled in by the report, when the
    # case's repetitions are known (report/verdicts.py).
    max_repeat: int | None = None
    stop_reason: str | None = None
    # Calls, tokens and cost of this conversation, by role.
    usage_by_role: dict[UsageRole, RoleUsage] | None = None
    # The state the agent left in its system after the conversation (`state:`), as its
    # end state URL answered it; absent without one.
    end_state: Any = None
    # Why it failed or was skipped (absent on a passed case): the target's reply, the
    # judge, the simulator, the infrastructure, a flake or the input.
    cause: Cause | None = None
    # The conversation's trace (docs/opentelemetry.md): 32 hex digits, as trace UIs
    # take it; absent for a conversation that ended before its first turn.
    trace_id: str | None = None

    def to_json_line(self) -> str:
        return self.model_dump_json()
