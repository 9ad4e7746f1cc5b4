"""Assertions made of assertions: not, any, all.

A group's parts are assertions of any registered type, groups included, validated like
the case's own: `Assertion` is the union of the types registered when a model using it
is built. pydantic reuses a model's built schema inside another's, so the group models
defer building theirs until first used: the case models, built once every type of this
package has registered, then build all three together, each holding the others.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Literal

from pydantic import ConfigDict, Field

from agenttest_worker.assertions.checking import (
    Assertion,
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    begin,
    on_change,
    register,
)


class NotAssertion(AssertionSpec):
    """Passes when `assertion` fails (one that could not be evaluated still fails)."""

    model_config = ConfigDict(defer_build=True)

    type: Literal["not"]
    assertion: Assertion

    def parts(self) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
        yield ("assertion",), self.assertion


class AnyAssertion(AssertionSpec):
    """Passes when at least one of `assertions` passes."""

    model_config = ConfigDict(defer_build=True)

    type: Literal["any"]
    assertions: list[Assertion] = Field(min_length=1)

    def parts(self) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
        return ((("assertions", i), part) for i, part in enumerate(self.assertions))


class AllAssertion(AssertionSpec):
    """Passes when every one of `assertions` passes."""

    model_config = ConfigDict(defer_build=True)

    type: Literal["all"]
    assertions: list[Assertion] = Field(min_length=1)

    def parts(self) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
        return ((("assertions", i), part) for i, part in enumerate(self.assertions))


async def _outcomes(parts: list[AssertionSpec], ctx: AssertionContext) -> list[AssertionOutcome]:
    begun = [begin(part, ctx) for part in parts]
    waiting = [found for found in begun if inspect.isawaitable(found)]
    done = iter(await asyncio.gather(*waiting)) if waiting else iter(())
    return [next(done) if inspect.isawaitable(found) else found for found in begun]


def _listing(parts: list[AssertionSpec], outcomes: list[AssertionOutcome]) -> str:
    return "; ".join(
        f"{part.type} {'passed' if outcome.passed else 'failed'}: {outcome.reason}"
        for part, outcome in zip(parts, outcomes, strict=True)
    )


@register(NotAssertion)
async def check_not(spec: NotAssertion, ctx: AssertionContext) -> AssertionOutcome:
    [outcome] = await _outcomes([spec.assertion], ctx)
    if outcome.error is not None:
        return AssertionOutcome(
            False,
            f"not: {spec.assertion.type} could not be evaluated: {outcome.reason}",
            error=outcome.error,
        )
    verdict = "failed" if not outcome.passed else "passed"
    return AssertionOutcome(
        not outcome.passed, f"not: {spec.assertion.type} {verdict}: {outcome.reason}"
    )


@register(AnyAssertion)
async def check_any(spec: AnyAssertion, ctx: AssertionContext) -> AssertionOutcome:
    outcomes = await _outcomes(list(spec.assertions), ctx)
    passed = sum(o.passed for o in outcomes)
    summary = f"{passed} of {len(outcomes)} passed"
    return AssertionOutcome(
        passed > 0, f"any: {summary} ({_listing(list(spec.assertions), outcomes)})"
    )


@register(AllAssertion)
async def check_all(spec: AllAssertion, ctx: AssertionContext) -> AssertionOutcome:
    outcomes = await _outcomes(list(spec.assertions), ctx)
    passed = sum(o.passed for o in outcomes)
    summary = f"{passed} of {len(outcomes)} passed"
    return AssertionOutcome(
        passed == len(outcomes), f"all: {summary} ({_listing(list(spec.assertions), outcomes)})"
    )


def _rebuild_groups() -> None:
    # A type registered once the groups were built (a plugin's): each rebuild reuses the
    # other groups' built schemas, so a round reaches one level of nesting further; the
    # late type is accepted in groups nested up to as many levels as there are rounds.
    models = (NotAssertion, AnyAssertion, AllAssertion)
    for _ in models:
        for model in models:
            model.model_rebuild(force=True)


on_change(_rebuild_groups)
