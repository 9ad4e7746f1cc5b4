"""The assertion extension point: a spec model per `type` and a checker registered for it.

Every family module defines its spec models (validated at load time, so a typo in a
case file is caught before anything runs) and registers one checker per `type`.
Checkers may be plain or async functions; both get the spec and an AssertionContext.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from agenttest_worker.results import AssertionOutcome as AssertionOutcome

if TYPE_CHECKING:
    from agenttest_worker.results import ToolCall


class AssertionSpec(BaseModel):
    """Fields every assertion may carry. Unknown fields are errors: they are usually typos."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    description: str | None = None


class RoleCaller(Protocol):
    """How agent-backed assertions reach a judge (implemented by the agents package)."""

    async def judge(
        self,
        use: str | None,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any],
        connector: str | None,
    ) -> AssertionOutcome: ...

    async def run_script_assertion(
        self, use: str, response: dict[str, Any], metadata: dict[str, Any]
    ) -> AssertionOutcome: ...


@dataclass
class AssertionContext:
    """Everything a checker may look at for one turn, or for the final assertions.

    `document` is what json_path and type assertions read (DESIGN.md): per turn, the
    output parsed as JSON when it is JSON, else {"content", "tool_calls"}; finally,
    {"turns", "last_output", "tool_results", "state"}.
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


Checker = Callable[[Any, AssertionContext], "AssertionOutcome | Awaitable[AssertionOutcome]"]

_CHECKERS: dict[str, Checker] = {}


def register(type_name: str) -> Callable[[Checker], Checker]:
    """Register the checker for assertions of `type_name`."""

    def decorate(fn: Checker) -> Checker:
        if type_name in _CHECKERS:
            raise ValueError(f"assertion type {type_name!r} registered twice")
        _CHECKERS[type_name] = fn
        return fn

    return decorate


def checker_for(type_name: str) -> Checker:
    try:
        return _CHECKERS[type_name]
    except KeyError:
        raise LookupError(f"no checker registered for assertion type {type_name!r}") from None


async def evaluate(spec: AssertionSpec, ctx: AssertionContext) -> AssertionOutcome:
    """Run one assertion; a checker that raises fails the assertion, never the run."""
    try:
        outcome = checker_for(spec.type)(spec, ctx)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        assert isinstance(outcome, AssertionOutcome)
        return outcome
    except Exception as exc:  # one broken assertion must not sink the case's other results
        return AssertionOutcome(
            passed=False,
            reason=f"assertion could not be evaluated: {exc}",
            error=f"{type(exc).__name__}: {exc}",
        )
