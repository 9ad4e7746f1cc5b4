"""Assertions on the JSON document of a turn or of the conversation: json_path, type.

Paths are parsed with jsonpath-ng's extended parser (filters, arithmetic) when the case
file is loaded, so a path that does not parse is a load error, not a failed run.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import field_validator, model_validator

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.json_values import compile_path, find, json_equal

JsonType = Literal["string", "number", "integer", "boolean", "array", "object", "null"]

# Names people write for JSON types in other languages, mapped to JSON Schema's names.
TYPE_ALIASES: dict[str, JsonType] = {
    "str": "string",
    "text": "string",
    "float": "number",
    "double": "number",
    "numeric": "number",
    "int": "integer",
    "bool": "boolean",
    "list": "array",
    "dict": "object",
    "map": "object",
    "none": "null",
    "nil": "null",
}


def _valid_path(path: str) -> str:
    compile_path(path)
    return path


class JsonPathAssertion(AssertionSpec):
    """`$.status` equals `value`; without `value`, the path must match something."""

    type: Literal["json_path"]
    path: str
    value: Any = None

    _path_ok = field_validator("path")(_valid_path)

    @property
    def expects_value(self) -> bool:
        return "value" in self.model_fields_set


class TypeAssertion(AssertionSpec):
    """The value at `path` (default: the whole document) has JSON type `value`."""

    type: Literal["type"]
    path: str = "$"
    value: JsonType

    _path_ok = field_validator("path")(_valid_path)

    @model_validator(mode="before")
    @classmethod
    def _alias_type_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("value"), str):
            name = data["value"].strip().lower()
            data = {**data, "value": TYPE_ALIASES.get(name, name)}
        return data


def json_type(value: Any) -> JsonType:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:119] + "…"


@register(JsonPathAssertion)
def check_json_path(spec: JsonPathAssertion, ctx: AssertionContext) -> AssertionOutcome:
    found = find(spec.path, ctx.document)
    if not spec.expects_value:
        if found:
            return AssertionOutcome(True, f"{spec.path} found: {_short(found[0])}")
        return AssertionOutcome(False, f"{spec.path} matched nothing in {_short(ctx.document)}")
    if not found:
        return AssertionOutcome(
            False,
            f"{spec.path} matched nothing (expected {_short(spec.value)}) "
            f"in {_short(ctx.document)}",
        )
    # One match compares directly; several pass when any equals the value or when the
    # value is the whole list of matches (`$.items[*].id` = ["a", "b"]).
    if any(json_equal(v, spec.value) for v in found) or json_equal(found, spec.value):
        return AssertionOutcome(True, f"{spec.path} = {_short(spec.value)}")
    actual = found[0] if len(found) == 1 else found
    return AssertionOutcome(
        False, f"{spec.path} is {_short(actual)}, expected {_short(spec.value)}"
    )


def _a(type_name: str) -> str:
    return f"an {type_name}" if type_name[0] in "aeiou" else f"a {type_name}"


@register(TypeAssertion)
def check_type(spec: TypeAssertion, ctx: AssertionContext) -> AssertionOutcome:
    found = find(spec.path, ctx.document)
    if not found:
        return AssertionOutcome(
            False,
            f"{spec.path} matched nothing in {_short(ctx.document)}; expected {_a(spec.value)}",
        )
    actual = json_type(found[0])
    ok = actual == spec.value or (spec.value == "number" and actual == "integer")
    if ok:
        return AssertionOutcome(True, f"{spec.path} is {_a(spec.value)}")
    return AssertionOutcome(
        False, f"{spec.path} is {_a(actual)} ({_short(found[0])}), expected {_a(spec.value)}"
    )
