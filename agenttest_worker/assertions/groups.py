"""Assertions made of assertions: not, any, all.

A group's parts are assertions of any registered type, groups included, validated like
the case's own: against the union of the types registered when a model using it is
built. pydantic reuses a model's built schema inside another's (and the first copy of a
model it meets in a schema stands for every later one), so a group model built before a
type registered would carry the old union into every schema that holds it. The group
models therefore defer building theirs until first used, and a change to the registry
puts them back unbuilt: the case models, rebuilt next, then build all three afresh
together, each holding the others, whatever the nesting.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, GetCoreSchemaHandler
from pydantic.errors import PydanticUndefinedAnnotation
from pydantic_core import CoreSchema

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    RegisteredSpecs,
    begin,
    on_change,
    register,
)


class _Parts(RegisteredSpecs):
    """The registered types, as `Assertion`; while the registry changes, not yet built:
    a model asked to build then stays unbuilt (pydantic's answer to an annotation it
    cannot resolve yet) and builds on first use, from the registry as it is by then."""

    changing = False

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        if _Parts.changing:
            raise PydanticUndefinedAnnotation("Assertion", "assertion types are changing")
        return super().__get_pydantic_core_schema__(source, handler)


Part = Annotated[AssertionSpec, _Parts()]


class NotAssertion(AssertionSpec):
    """Passes when `assertion` fails (one that could not be evaluated still fails)."""

    model_config = ConfigDict(defer_build=True)

    type: Literal["not"]
    assertion: Part

    def parts(self) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
        yield ("assertion",), self.assertion


class AnyAssertion(AssertionSpec):
    """Passes when at least one of `assertions` passes."""

    model_config = ConfigDict(defer_build=True)

    type: Literal["any"]
    assertions: list[Part] = Field(min_length=1)

    def parts(self) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
        return ((("assertions", i), part) for i, part in enumerate(self.assertions))


class AllAssertion(AssertionSpec):
    """Passes when every one of `assertions` passes."""

    model_config = ConfigDict(defer_build=True)

    type: Literal["all"]
    assertions: list[Part] = Field(min_length=1)

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
    verdict = "passed" if outcome.passed else "failed"
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


def _unbuild_groups() -> None:
    # Before the case models rebuild (this listener registered first): they then build
    # the groups inline from the new registry, and the groups' own schemas follow on use.
    _Parts.changing = True
    try:
        for model in (NotAssertion, AnyAssertion, AllAssertion):
            model.model_rebuild(force=True, raise_errors=False)
    finally:
        _Parts.changing = False


on_change(_unbuild_groups)
