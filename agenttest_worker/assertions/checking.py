"""The assertion extension point: a spec model and a checker per `type`, in one registry.

A family module defines each type's spec model (validated when the case file is
loaded, so a typo in a case file is caught before anything runs) and registers its
checker with it, next to the definition:

    class WordCountAssertion(AssertionSpec):
        type: Literal["word_count"]
        at_most: int

    @register(WordCountAssertion)
    def check_word_count(spec: WordCountAssertion, ctx: AssertionContext) -> AssertionOutcome:
        ...

The name is the spec's `type` literal. Checkers may be plain or async functions; both
get the spec and an AssertionContext. The registry is the one list of types: case
models validate their assertions against `Assertion`, the discriminated union of the
registered spec models (built when those models are); the messages for an unknown
`type` list `assertion_types()`; `evaluate` runs the registered checker.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    Protocol,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler
from pydantic_core import CoreSchema

from agenttest_worker.results import AssertionOutcome as AssertionOutcome

if TYPE_CHECKING:
    from agenttest_worker.agents.options import Options
    from agenttest_worker.results import ToolCall, TurnResult


class AssertionSpec(BaseModel):
    """Fields every assertion may carry. Unknown fields are errors: they are usually typos."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    description: str | None = None

    def parts(self) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
        """The assertions this one is made of, each with its field path in this one
        (a group's); none for the others."""
        return iter(())


def walk(
    assertion: AssertionSpec, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], AssertionSpec]]:
    """The assertion and every assertion nested in it, depth first, each with its field
    path (from `path`): what checks of a case's agents and scripts go through."""
    yield path, assertion
    for inner, part in assertion.parts():
        yield from walk(part, (*path, *inner))


class RoleCaller(Protocol):
    """How agent-backed assertions reach a judge (implemented by the agents package)."""

    async def judge(
        self,
        use: str | None,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any],
        options: Options | None,
    ) -> AssertionOutcome: ...

    async def judge_panel(
        self,
        use: str | Sequence[str] | None,
        votes: int | None,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any],
        options: Options | None,
    ) -> list[tuple[str, AssertionOutcome]]:
        """Each judge asked `votes` times (None: the configured default), concurrently:
        (judge, outcome) per ask. `options`: the assertion's (its `connector` picks the
        judge's entry, its `params` go over the judge entry's `params`)."""
        ...

    async def run_script_assertion(
        self, use: str, response: dict[str, Any], metadata: dict[str, Any]
    ) -> AssertionOutcome: ...


@dataclass
class AssertionContext:
    """Everything a checker may look at for one turn, or for the final assertions.

    `document` is what json_path and type assertions read (DESIGN.md): per turn, the
    output parsed as JSON when it is JSON, else {"content", "tool_calls"}; finally,
    {"turns", "last_output", "tool_results", "state"}. `turns`: for the final
    assertions, the turns played (what a golden assertion compares); none per turn.
    """

    output: str | None
    document: Any
    tool_calls: list[ToolCall]
    input: str | None
    messages: list[dict[str, Any]]
    final: bool
    case_id: str
    metadata: dict[str, Any] = field(default_factory=dict)
    roles: RoleCaller | None = None
    turns: list[TurnResult] = field(default_factory=list)


# -- the registry ----------------------------------------------------------------------

SpecT = TypeVar("SpecT", bound=AssertionSpec)
Checker = Callable[[SpecT, AssertionContext], AssertionOutcome | Awaitable[AssertionOutcome]]


@dataclass(frozen=True)
class AssertionType:
    name: str
    spec: type[AssertionSpec]
    checker: Checker[Any]


_TYPES: dict[str, AssertionType] = {}
_LISTENERS: list[Callable[[], None]] = []


def register(spec: type[SpecT]) -> Callable[[Checker[SpecT]], Checker[SpecT]]:
    """Register the checker of the assertions `spec` validates, under its `type` literal."""
    name = _type_name(spec)

    def decorate(checker: Checker[SpecT]) -> Checker[SpecT]:
        if name in _TYPES:
            raise ValueError(f"assertion type {name!r} registered twice")
        _TYPES[name] = AssertionType(name, spec, checker)
        _changed()
        return checker

    return decorate


def unregister(type_name: str) -> None:
    """Withdraw a type (one a test registered for itself, a plugin's)."""
    if _TYPES.pop(type_name, None) is None:
        raise LookupError(f"no assertion type {type_name!r} registered")
    _changed()


def on_change(listener: Callable[[], None]) -> None:
    """Call `listener` after every later registration or withdrawal.

    Models whose schema was built from the registry (the case models) rebuild
    themselves with it, so that a type registered once they exist is accepted too.
    """
    _LISTENERS.append(listener)


def _changed() -> None:
    for listener in _LISTENERS:
        listener()


def assertion_types() -> tuple[str, ...]:
    """The registered type names, in the order they were registered."""
    return tuple(_TYPES)


def spec_models() -> tuple[type[AssertionSpec], ...]:
    return tuple(t.spec for t in _TYPES.values())


def checker_for(type_name: str) -> Checker[Any]:
    try:
        return _TYPES[type_name].checker
    except KeyError:
        raise LookupError(f"no checker registered for assertion type {type_name!r}") from None


def _type_name(spec: type[AssertionSpec]) -> str:
    type_field = spec.model_fields.get("type") if issubclass(spec, AssertionSpec) else None
    annotation = type_field.annotation if type_field is not None else None
    names = get_args(annotation) if get_origin(annotation) is Literal else ()
    if len(names) != 1 or not isinstance(names[0], str):
        raise TypeError(
            f"{spec.__name__}: an assertion spec is an AssertionSpec whose `type` is "
            'Literal["name"], the name case files write'
        )
    return names[0]


class RegisteredSpecs:
    """Makes pydantic validate `Assertion` as the discriminated union (on `type`) of the
    spec models registered when the model using it is built, as the hand-written union
    was: unknown tags and misspelt fields are errors located at the field."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        models = spec_models()
        if len(models) == 1:
            return handler.generate_schema(models[0])
        return handler.generate_schema(Annotated[Union[models], Field(discriminator="type")])  # noqa: UP007


# What case models declare their assertions as: a registered spec model, any of them.
Assertion = Annotated[AssertionSpec, RegisteredSpecs()]


async def evaluate(spec: AssertionSpec, ctx: AssertionContext) -> AssertionOutcome:
    """Run one assertion; a checker that raises fails the assertion, never the run."""
    begun = begin(spec, ctx)
    return await begun if inspect.isawaitable(begun) else begun


def begin(
    spec: AssertionSpec, ctx: AssertionContext
) -> AssertionOutcome | Coroutine[Any, Any, AssertionOutcome]:
    """Start one assertion: a plain checker's outcome at once, an async one's to await
    (evaluate's, without a coroutine for the plain ones: most assertions)."""
    try:
        outcome = checker_for(spec.type)(spec, ctx)
        if inspect.isawaitable(outcome):
            return _finished(outcome)
        assert isinstance(outcome, AssertionOutcome)
        return outcome
    except Exception as exc:  # one broken assertion must not sink the case's other results
        return _broken(exc)


async def _finished(outcome: Awaitable[AssertionOutcome]) -> AssertionOutcome:
    try:
        done = await outcome
        assert isinstance(done, AssertionOutcome)
        return done
    except Exception as exc:
        return _broken(exc)


def _broken(exc: Exception) -> AssertionOutcome:
    return AssertionOutcome(
        passed=False,
        reason=f"assertion could not be evaluated: {exc}",
        error=f"{type(exc).__name__}: {exc}",
    )
