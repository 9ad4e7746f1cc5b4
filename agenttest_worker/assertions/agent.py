"""Agent-driven assertions: a validator (judge) agent decides, per the spec's validator mode.

The judge gets [user: the turn's input, assistant: the reply] plus `metadata` with
`test_mode: validator` and the assertion's metadata (criteria, ...). With
`conversation: true` (what YAML `criteria` become) it sees the conversation so far.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from agenttest_worker.assertions.base import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.options import Options
from agenttest_worker.refs import parse_ref


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


@register("agent")
async def check_agent(spec: AgentAssertion, ctx: AssertionContext) -> AssertionOutcome:
    if ctx.roles is None:
        raise RuntimeError("no agent caller available to run the judge")
    options = spec.options or Options()
    if spec.conversation or ctx.final:
        messages = list(ctx.messages)
    else:
        messages = [
            {"role": "user", "content": ctx.input or ""},
            {"role": "assistant", "content": ctx.output or ""},
        ]
    # The spec's validator metadata names the test (test_id) next to the criteria.
    metadata = {"test_id": ctx.case_id, **options.metadata}
    return await ctx.roles.judge(spec.use, messages, metadata, options.connector)
