"""Assertion types, one module per family, registered by the `type` users write.

`Assertion` is the discriminated union the case model validates against: an unknown
`type` or a misspelt field is a load-time error naming the field.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from agenttest_worker.assertions.agent import AgentAssertion
from agenttest_worker.assertions.base import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    RoleCaller,
    evaluate,
    register,
)
from agenttest_worker.assertions.script import ScriptAssertion
from agenttest_worker.assertions.structure import JsonPathAssertion, TypeAssertion
from agenttest_worker.assertions.text import ContainsAssertion, EqualsAssertion, RegexAssertion
from agenttest_worker.assertions.tools import ToolCalledAssertion

Assertion = Annotated[
    ContainsAssertion
    | EqualsAssertion
    | RegexAssertion
    | JsonPathAssertion
    | TypeAssertion
    | ToolCalledAssertion
    | AgentAssertion
    | ScriptAssertion,
    Field(discriminator="type"),
]

ASSERTION_TYPES = (
    "contains",
    "equals",
    "regex",
    "json_path",
    "type",
    "tool_called",
    "agent",
    "script",
)

__all__ = [
    "ASSERTION_TYPES",
    "AgentAssertion",
    "Assertion",
    "AssertionContext",
    "AssertionOutcome",
    "AssertionSpec",
    "ContainsAssertion",
    "EqualsAssertion",
    "JsonPathAssertion",
    "RegexAssertion",
    "RoleCaller",
    "ScriptAssertion",
    "ToolCalledAssertion",
    "TypeAssertion",
    "evaluate",
    "register",
]
