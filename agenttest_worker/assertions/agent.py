"""Agent-driven assertions: a validator (judge) agent decides, per the spec's validator mode.

The judge gets [user: the turn's input, assistant: the reply] plus `metadata` with
`test_mode: validator` and the assertion's metadata (criteria, ...). With
`conversation: true` (what YAML `criteria` become) it sees the conversation so far.

The reply is everything the agent did in the turn: its tool calls and the results it
was given (written as the conversation-level judge and the simulator read them,
`[tool calls: name(args)]`, `[tool result name: ...]`), then its text. A reply that
only calls tools would otherwise reach the judge empty.

Votes and panels: `use` may list several judges (a panel of different models), and
each judge is asked `votes` times (default `defaults.judge_votes`), all at once. The
verdict is the majority of the votes, a tie failing unless `tie: pass`; a vote whose
call failed is a failing vote, and when every call failed the assertion errors as one
failed call does. The outcome keeps every vote and the share agreeing with the verdict
(`agreement`); below `min_agreement` the assertion fails ("judges disagree"). With
`min_score`, a passing verdict also needs the judges' score (the mean over the votes)
to reach it, and a reply without a score fails. A single ask keeps the judge's own
outcome (no `votes` on the record).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, field_validator

from agenttest_worker.agents.options import Options
from agenttest_worker.agents.refs import parse_ref
from agenttest_worker.agents.roles import conversation_for_role
from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.results import JudgeVote

# Scores are compared and their mean kept to this many decimals: the mean of 0.9, 0.7
# and 0.8 is 0.7999999999999999 in floating point, which must reach a min_score of 0.8.
_SCORE_DIGITS = 9


class AgentAssertion(AssertionSpec):
    type: Literal["agent"]
    # None means the configured default judge (`defaults.judge` in agenttest.yaml); a
    # list is a panel of judges, each asked `votes` times.
    use: str | list[str] | None = None
    options: Options | None = None
    conversation: bool = False
    # How often each judge is asked; None means `defaults.judge_votes`.
    votes: int | None = Field(default=None, ge=1)
    tie: Literal["fail", "pass"] = "fail"
    min_agreement: float | None = Field(default=None, ge=0, le=1)
    min_score: float | None = Field(default=None, allow_inf_nan=False)

    @field_validator("use")
    @classmethod
    def _agents_ref(cls, use: str | list[str] | None) -> str | list[str] | None:
        if use is None:
            return None
        if isinstance(use, str):
            return _judge_ref(use)
        if not use:
            raise ValueError("a panel of judges names at least one agent")
        panel = [_judge_ref(u) for u in use]
        twice = next((j for i, j in enumerate(panel) if j in panel[:i]), None)
        if twice is not None:
            raise ValueError(
                f"{twice} is in the panel twice: to ask a judge more than once, use `votes`"
            )
        return panel


def _judge_ref(use: str) -> str:
    ref = parse_ref(use, default_kind="agents")
    if ref.kind != "agents":
        raise ValueError(
            f"{use!r}: an agent assertion uses agents:NAME (scripts go in type script)"
        )
    return str(ref)


@register(AgentAssertion)
async def check_agent(spec: AgentAssertion, ctx: AssertionContext) -> AssertionOutcome:
    if ctx.roles is None:
        raise RuntimeError("no agent caller available to run the judge")
    options = spec.options or Options()
    if spec.conversation or ctx.final:
        messages = list(ctx.messages)
    else:
        messages = [
            {"role": "user", "content": ctx.input or ""},
            {"role": "assistant", "content": _turn_reply(ctx)},
        ]
    # The spec's validator metadata names the test (test_id) next to the criteria.
    metadata = {"test_id": ctx.case_id, **options.metadata}
    asks = await ctx.roles.judge_panel(spec.use, spec.votes, messages, metadata, options)
    return decide(spec, asks)


def decide(spec: AgentAssertion, asks: list[tuple[str, AssertionOutcome]]) -> AssertionOutcome:
    """The assertion's outcome from every ask's (judge, outcome)."""
    if len(asks) == 1:
        outcome = asks[0][1]
        if spec.min_score is None or outcome.error is not None or not outcome.passed:
            return outcome
        return _score_gate(spec.min_score, outcome, [asks[0]]) or outcome
    votes = [
        JudgeVote(
            judge=judge,
            passed=o.passed and o.error is None,
            score=o.score,
            reason=o.reason,
            error=o.error,
        )
        for judge, o in asks
    ]
    n = len(votes)
    failed = [o for _, o in asks if o.error is not None]
    if len(failed) == n:
        first = failed[0]
        return AssertionOutcome(
            False,
            f"{first.reason} (all {n} judge calls failed)",
            error=first.error,
            votes=votes,
            agreement=1.0,
        )
    passes = sum(v.passed for v in votes)
    passed = passes * 2 > n or (passes * 2 == n and spec.tie == "pass")
    agreeing = [(judge, o) for (judge, o), v in zip(asks, votes, strict=True) if v.passed == passed]
    # The reason is the majority's: a judge's own words rather than a failed call's.
    judge, said = next(((j, o) for j, o in agreeing if o.error is None), agreeing[0])
    counted = (
        f"a tie, {len(agreeing)} of {n} votes; tie: {spec.tie}"
        if passes * 2 == n
        else f"{len(agreeing)} of {n} votes"
    )
    scores = [v.score for v in votes if v.score is not None]
    outcome = AssertionOutcome(
        passed,
        f"{said.reason} ({counted})",
        score=round(math.fsum(scores) / len(scores), _SCORE_DIGITS) if scores else None,
        suggestions=said.suggestions,
        plan=said.plan,
        thinking=said.thinking,
        judge_prompt=said.judge_prompt,
        judge_reply=said.judge_reply,
        votes=votes,
        agreement=len(agreeing) / n,
    )
    if spec.min_agreement is not None and len(agreeing) < _at_least(spec.min_agreement, n):
        return replace(
            outcome,
            passed=False,
            reason=f"judges disagree: {len(agreeing)} of {n} votes ({len(agreeing) / n:.0%}) "
            f"agree that it {'passed' if passed else 'failed'}, below min_agreement "
            f"{spec.min_agreement:.0%}; {judge}: {said.reason}",
        )
    if passed and spec.min_score is not None:
        return _score_gate(spec.min_score, outcome, asks) or outcome
    return outcome


def _at_least(share: float, n: int) -> int:
    """The votes a share of n calls for, in whole votes (so 2/3 of 3 is 2, exactly)."""
    return math.ceil(share * n - 1e-9)


def _score_gate(
    min_score: float, outcome: AssertionOutcome, asks: list[tuple[str, AssertionOutcome]]
) -> AssertionOutcome | None:
    """The failed outcome when a passing verdict's score misses `min_score`, else None."""
    unscored = sorted({judge for judge, o in asks if o.error is None and o.score is None})
    scored = sum(1 for _, o in asks if o.score is not None)
    if unscored:
        who = f"judge {unscored[0]}" if len(unscored) == 1 else f"judges {', '.join(unscored)}"
        reason = (
            f"{who} gave no score, and min_score {min_score:g} needs one "
            f"(the verdict alone: {outcome.reason})"
        )
    elif outcome.score is not None and round(outcome.score, _SCORE_DIGITS) < min_score:
        mean = f", the mean of {scored} votes" if scored > 1 else ""
        reason = f"score {outcome.score:g}{mean}, below min_score {min_score:g}: {outcome.reason}"
    else:
        return None
    return replace(outcome, passed=False, reason=reason)


def _turn_reply(ctx: AssertionContext) -> str:
    """The turn's reply as one text: what followed the turn's user message."""
    turn: list[dict[str, Any]] = []
    for message in reversed(ctx.messages):
        if message.get("role") == "user":
            break
        turn.append(message)
    if not any(m.get("tool_calls") for m in turn):
        return ctx.output or ""
    folded = conversation_for_role(list(reversed(turn)))
    return "\n".join(m["content"] for m in folded if m["role"] == "assistant" and m["content"])
