"""Assertions on how fast the target answered: latency.

    {"type": "latency", "max_ms": 2000, "first_token_max_ms": 500}

`max_ms` bounds the target's whole reply in the turn (from the input sent to the end of
its final reply, mocked tool rounds included; judges and the simulator do not count).
`first_token_max_ms` bounds the time to its first piece of content, which only a
streamed reply has: asked of a reply read whole, it fails and says so, rather than
passing on a number that was never measured.

The engine hands these checkers a TimedContext, an AssertionContext with the turn's
times; final assertions have no single reply to time, and fail saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)


@dataclass
class TimedContext(AssertionContext):
    """A turn's context with its times: to the first token (streamed replies only) and
    to the end of the target's final reply."""

    first_token_ms: int | None = None
    response_ms: int | None = None


class LatencyAssertion(AssertionSpec):
    type: Literal["latency"]
    max_ms: int | None = Field(default=None, ge=0)
    first_token_max_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _some_bound(self) -> LatencyAssertion:
        if self.max_ms is None and self.first_token_max_ms is None:
            raise ValueError("a latency assertion needs max_ms, first_token_max_ms or both")
        return self


@register(LatencyAssertion)
def check_latency(spec: LatencyAssertion, ctx: AssertionContext) -> AssertionOutcome:
    if not isinstance(ctx, TimedContext) or ctx.final:
        return AssertionOutcome(
            False,
            "latency is checked on a turn's reply: put it in the turn's assertions",
            error="no timing for final assertions",
        )
    failures: list[str] = []
    measured: list[str] = []
    if spec.first_token_max_ms is not None:
        if ctx.first_token_ms is None:
            failures.append(
                "no time to first token: the reply was not streamed "
                "(set stream: on the agent) or carried no content"
            )
        elif ctx.first_token_ms > spec.first_token_max_ms:
            failures.append(
                f"first token after {ctx.first_token_ms} ms "
                f"(at most {spec.first_token_max_ms} ms allowed)"
            )
        else:
            measured.append(f"first token after {ctx.first_token_ms} ms")
    if spec.max_ms is not None:
        if ctx.response_ms is None:
            failures.append("no reply time recorded")
        elif ctx.response_ms > spec.max_ms:
            failures.append(f"reply took {ctx.response_ms} ms (at most {spec.max_ms} ms allowed)")
        else:
            measured.append(f"reply took {ctx.response_ms} ms")
    if failures:
        return AssertionOutcome(False, "; ".join(failures))
    return AssertionOutcome(True, "; ".join(measured))
