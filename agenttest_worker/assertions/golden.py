"""golden: the conversation compared with its golden conversation, recorded earlier.

The submitter reads the golden file into the assertion (`recorded`, and the file it
came from in `golden_file`) before the run is stored, so that a worker never reads the
submitter's disk. `match` says what must be the same:

- exact: every turn's reply and tool calls, turn by turn, and the number of turns;
- tools: the tool calls of the whole conversation, in order (names, and arguments
  unless `args: ignore`);
- judge: the number of turns, and each reply that is not word for word the golden one
  is put to a judge (`use`, default `defaults.judge`), which decides whether it means
  the same; its reason is the assertion's.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from agenttest_worker.agents.refs import parse_ref
from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.assertions.golden_conversations import (
    GoldenConversation,
    GoldenMatch,
    GoldenTurn,
    compare,
    describe_calls,
    played_turns,
    same_calls,
)

# The criteria a judge is given: the golden reply quoted, as judges read criteria.
JUDGE_CRITERIA = (
    "The assistant's reply means the same as the golden reply (the same facts, answers, "
    'decisions and questions, whatever the wording): "{reply}"'
)
_QUOTE_AT_MOST = 160


class GoldenAssertion(AssertionSpec):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"type": "golden"},
                {"type": "golden", "match": "exact"},
                {"type": "golden", "match": "tools", "args": "ignore"},
                {"type": "golden", "match": "judge", "use": "agents:judge"},
            ]
        }
    )

    type: Literal["golden"]
    match: GoldenMatch = Field(
        default="tools",
        description="exact: the same replies and tool calls per turn; tools: the same tool "
        "calls in order; judge: a judge decides whether each reply means the same",
    )
    args: Literal["exact", "ignore"] = Field(
        default="exact",
        description="compare the tool calls' arguments (exact) or only their names (ignore)",
    )
    use: str | None = Field(
        default=None, description="the judge of match: judge (default: defaults.judge)"
    )
    # Filled in by the submitter from the case's golden file (written inline, used as is).
    recorded: GoldenConversation | None = Field(
        default=None,
        description="the golden conversation; read from <case file>.golden/<id>.json when "
        "not given",
    )
    golden_file: str | None = Field(
        default=None, description="where the golden conversation was read from (set by the run)"
    )

    @field_validator("use")
    @classmethod
    def _judge(cls, use: str | None) -> str | None:
        if use is None:
            return None
        ref = parse_ref(use, default_kind="agents")
        if ref.kind != "agents":
            raise ValueError(f"{use!r}: the judge of a golden assertion is agents:NAME")
        return str(ref)

    @model_validator(mode="after")
    def _use_for_judge(self) -> GoldenAssertion:
        if self.use is not None and self.match != "judge":
            raise ValueError("`use` names the judge of `match: judge`; this one is " + self.match)
        return self


def _quote(text: str | None) -> str:
    text = (text or "").replace("\n", " ")
    return repr(text if len(text) <= _QUOTE_AT_MOST else text[:_QUOTE_AT_MOST] + "…")


@register(GoldenAssertion)
async def check_golden(spec: GoldenAssertion, ctx: AssertionContext) -> AssertionOutcome:
    if not ctx.final:
        return AssertionOutcome(
            False, "golden compares the whole conversation: put it in final_assertions"
        )
    if spec.recorded is None:
        if spec.golden_file is None:
            return AssertionOutcome(
                False, "no golden conversation: the case has no case file to keep one beside"
            )
        return AssertionOutcome(
            False,
            f"no golden conversation at {spec.golden_file}: record one with --update-golden",
        )
    golden = spec.recorded.turns
    new = played_turns(ctx.turns)
    if spec.match == "tools":
        return _tools(spec, golden, new)
    if len(golden) != len(new):
        return AssertionOutcome(
            False, f"the golden conversation has {len(golden)} turn(s), this one {len(new)}"
        )
    if spec.match == "exact":
        return _exact(spec, golden, new)
    return await _judged(spec, ctx, golden, new)


def _tools(
    spec: GoldenAssertion, golden: list[GoldenTurn], new: list[GoldenTurn]
) -> AssertionOutcome:
    before = [c for t in golden for c in t.tool_calls]
    now = [c for t in new for c in t.tool_calls]
    args = spec.args == "exact"
    index = next(
        (
            i
            for i in range(max(len(before), len(now)))
            if not same_calls(before[i : i + 1], now[i : i + 1], args=args)
        ),
        None,
    )
    if index is None:
        return AssertionOutcome(
            True,
            f"the golden conversation's tool calls, in order: {describe_calls(now, args=args)}",
        )
    wanted = describe_calls(before[index : index + 1], args=args) if index < len(before) else None
    made = describe_calls(now[index : index + 1], args=args) if index < len(now) else None
    return AssertionOutcome(
        False,
        f"tool call {index + 1} should be {wanted or 'no call'}, was {made or 'no call'}; "
        f"golden: {describe_calls(before, args=args)}; new: {describe_calls(now, args=args)}",
    )


def _exact(
    spec: GoldenAssertion, golden: list[GoldenTurn], new: list[GoldenTurn]
) -> AssertionOutcome:
    args = spec.args == "exact"
    for row in compare(golden, new, args=args):
        assert row.golden is not None and row.new is not None
        if row.reply_differs:
            return AssertionOutcome(
                False,
                f"turn {row.turn}: the reply differs from the golden one: golden "
                f"{_quote(row.golden.reply)}, new {_quote(row.new.reply)}",
            )
        if row.tools_differ:
            return AssertionOutcome(
                False,
                f"turn {row.turn}: the tool calls differ from the golden ones: golden "
                f"{describe_calls(row.golden.tool_calls, args=args)}; "
                f"new {describe_calls(row.new.tool_calls, args=args)}",
            )
    return AssertionOutcome(
        True, f"the golden conversation's replies and tool calls ({len(new)} turn(s))"
    )


async def _judged(
    spec: GoldenAssertion, ctx: AssertionContext, golden: list[GoldenTurn], new: list[GoldenTurn]
) -> AssertionOutcome:
    rows = [r for r in compare(golden, new, args=False) if r.reply_differs]
    if not rows:
        return AssertionOutcome(
            True, f"the golden conversation's replies, word for word ({len(new)} turn(s))"
        )
    if ctx.roles is None:
        raise RuntimeError("no agent caller available to run the judge")
    roles = ctx.roles

    async def ask(old: GoldenTurn, now: GoldenTurn) -> AssertionOutcome:
        messages = [
            {"role": "user", "content": now.input or ""},
            {"role": "assistant", "content": now.reply or ""},
        ]
        metadata = {
            "test_id": ctx.case_id,
            "criteria": JUDGE_CRITERIA.format(reply=old.reply or ""),
            "golden_reply": old.reply or "",
        }
        return await roles.judge(spec.use, messages, metadata, None)

    pairs = [(r.golden, r.new) for r in rows if r.golden is not None and r.new is not None]
    outcomes = await asyncio.gather(*(ask(old, now) for old, now in pairs))
    for row, outcome in zip(rows, outcomes, strict=True):
        if outcome.error is not None or not outcome.passed:
            said = (
                "could not judge"
                if outcome.error is not None
                else "finds it does not mean the same"
            )
            return AssertionOutcome(
                False,
                f"turn {row.turn}: the judge {said} as the golden reply: {outcome.reason}",
                error=outcome.error,
            )
    judged = ", ".join(str(r.turn) for r in rows)
    return AssertionOutcome(
        True,
        f"the judge finds every reply means the same as the golden one (turn(s) {judged} "
        f"judged; {outcomes[-1].reason})",
    )
