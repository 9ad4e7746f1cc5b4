"""Running a turn's (or a conversation's) assertions against what the agent did."""

from __future__ import annotations

import asyncio
from typing import cast

from agenttest_worker.assertions import Assertion, AssertionContext
from agenttest_worker.assertions.checking import begin
from agenttest_worker.results import (
    AssertionOutcome,
    AssertionResult,
    TurnResult,
)


async def run_assertions(
    assertions: list[Assertion], ctx: AssertionContext
) -> list[AssertionResult]:
    # Plain checkers (most) are done at once; the async ones (an agent judging) run
    # together, in tasks only when there are several: a task per assertion cost every
    # turn a task and a pass of the event loop.
    begun = [begin(a, ctx) for a in assertions]
    waiting = [
        (i, found) for i, found in enumerate(begun) if not isinstance(found, AssertionOutcome)
    ]
    if len(waiting) == 1:
        begun[waiting[0][0]] = await waiting[0][1]
    elif waiting:
        done = await asyncio.gather(*(found for _, found in waiting))
        for (i, _), outcome in zip(waiting, done, strict=True):
            begun[i] = outcome
    outcomes = [cast(AssertionOutcome, found) for found in begun]
    results = []
    for spec, outcome in zip(assertions, outcomes, strict=True):
        written = spec.model_dump(mode="json", exclude_unset=True)
        written["type"] = spec.type
        # An agent assertion's `votes: N` (how often to ask) becomes the votes given.
        written.pop("votes", None)
        results.append(
            AssertionResult.model_validate(
                {
                    **written,
                    "passed": outcome.passed,
                    "reason": outcome.reason,
                    "score": outcome.score,
                    "suggestions": outcome.suggestions,
                    "error": outcome.error,
                    "votes": outcome.votes,
                    "agreement": outcome.agreement,
                    "plan": outcome.plan,
                    "thinking": outcome.thinking,
                    "judge_prompt": outcome.judge_prompt,
                    "judge_reply": outcome.judge_reply,
                }
            )
        )
    return results


def grade_turn(turn: TurnResult, results: list[AssertionResult]) -> None:
    """Record a turn's assertion results: its `assertion_errors` and its status.

    A turn fails when an assertion failed or its reply had problems (malformed tool
    calls); played and re-judged turns are graded the same way.
    """
    turn.assertions = results
    errors = [a.reason or a.error or "failed" for a in results if not a.passed]
    turn.assertion_errors = errors or None
    turn.status = "failed" if errors or turn.problems else "passed"
