"""Agent-driven assertions: a validator (judge) agent decides, per the spec's validator mode.

The judge gets [user: the turn's input, assistant: the reply] plus `metadata` with
`test_mode: validator` and the assertion's metadata (criteria, ...). With
`conversation: true` (what YAML `criteria` become) it sees the conversation so far.

The reply is everything the agent did in the turn: its tool calls and the results it
was given (written as the conversation-level judge and the simulator read them,
`[tool calls: name(args)]`, `[tool result name: ...]`), then its text. A reply that
only calls tools would otherwise reach the judge empty.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from agenttest_worker.agents.options import Options
from agenttest_worker.agents.refs import parse_ref
from agenttest_worker.agents.roles import conversation_for_role
from agenttest_worker.assertions.base import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)


class AgentAssertion(AssertionSpec):
    type: Literal["agent"]
    # None means the configured default judge (`defaults.judge` in agenttest.yaml).
    use: str | None = None
    options: Options | None = None
    conversation: bool = False

    @field_validator("use")
    @classmethod
    def _agents_ref(cls, use: str | None) -> str | None:
        if use is None:
            return None
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
    return await ctx.roles.judge(spec.use, messages, metadata, options.connector)


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
