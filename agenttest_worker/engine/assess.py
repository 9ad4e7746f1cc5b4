"""Running a turn's (or a conversation's) assertions against what the agent did."""

from __future__ import annotations

import asyncio

from agenttest_worker.assertions import Assertion, AssertionContext, evaluate
from agenttest_worker.results import (
    AssertionResult,
)


async def run_assertions(
    assertions: list[Assertion], ctx: AssertionContext
) -> list[AssertionResult]:
    outcomes = await asyncio.gather(*(evaluate(a, ctx) for a in assertions))
    results = []
    for spec, outcome in zip(assertions, outcomes, strict=True):
        written = spec.model_dump(mode="json", exclude_unset=True)
        written["type"] = spec.type
        results.append(
            AssertionResult.model_validate(
                {
                    **written,
                    "passed": outcome.passed,
                    "reason": outcome.reason,
                    "score": outcome.score,
                    "suggestions": outcome.suggestions,
                    "error": outcome.error,
                }
            )
        )
    return results
