"""Script assertions: a Python callable from the configured scripts folder decides.

The callable gets `response` (input, output, tool_calls, document, messages, final)
and the assertion's `metadata`, and returns a bool or {"passed", "reason", "score"}.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from agenttest_worker.agents.options import Options
from agenttest_worker.agents.refs import parse_ref
from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)


class ScriptAssertion(AssertionSpec):
    type: Literal["script"]
    use: str
    options: Options | None = None

    @field_validator("use")
    @classmethod
    def _scripts_ref(cls, use: str) -> str:
        ref = parse_ref(use, default_kind="scripts")
        if ref.kind != "scripts":
            raise ValueError(f"{use!r}: a script assertion uses scripts:NAME")
        return str(ref)


@register(ScriptAssertion)
async def check_script(spec: ScriptAssertion, ctx: AssertionContext) -> AssertionOutcome:
    if ctx.roles is None:
        raise RuntimeError("no script runner available")
    response = {
        "input": ctx.input,
        "output": ctx.output,
        "content": ctx.output,
        "tool_calls": [c.model_dump(exclude_none=True) for c in ctx.tool_calls],
        "document": ctx.document,
        "messages": ctx.messages,
        "final": ctx.final,
        "case_id": ctx.case_id,
    }
    metadata = dict((spec.options or Options()).metadata)
    return await ctx.roles.run_script_assertion(spec.use, response, metadata)
