"""`agenttest-submit schema [cases|yaml|config]`: JSON Schemas of what users write, for editors.

- `cases`: a JSON case file (yao format): one case, an array of cases or
  {"cases": [...]}. One line of a JSONL file is one case, which the same schema
  validates (editors do not validate JSONL; scripts and CI checks can, line by line).
- `yaml`: a tdx YAML case file: a `tests:` list of flat, rounds or mixed tests.
- `config`: agenttest.yaml, where every value that is not free text also takes a
  `${VAR}` / `${VAR:-default}` reference (interpolated when the file is loaded).

Generated from the pydantic models the loaders validate with, so a new field, a new
assertion type or a new agent protocol is in the schema as soon as it is registered.
Where a model accepts more than its fields' types say (a before-validator: durations
written "30s", numbers meant as text, `tags: smoke`, a regex's `value`), the schema
says so here, next to the list of those cases. The loader stays the authority: the
schema refuses nothing that loads (but the fields the readers set themselves, which
a file has no business writing), and most of what does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

from agenttest_submit.cli.request import SCHEMA_KINDS, SchemaKind
from agenttest_worker.agents import AgentConfig, ProjectConfig, protocol_names
from agenttest_worker.assertions import (
    TYPE_ALIASES,
    ContainsAssertion,
    RegexAssertion,
    TypeAssertion,
)
from agenttest_worker.cases import Case, InteractiveConfig, YamlTest

__all__ = ["SCHEMAS", "SCHEMA_KINDS", "SchemaKind", "schema_text"]

# Draft 7: what VS Code, the YAML language server and JetBrains IDEs all read. The
# definitions are under `$defs`, which `$ref` pointers reach in any draft.
DRAFT = "http://json-schema.org/draft-07/schema#"

# A string holding a ${VAR} or ${VAR:-default} reference (agents/config.py `_ENV_REF`).
ENV_REF_NAME = "EnvironmentReference"
ENV_REF: JsonSchemaValue = {
    "type": "string",
    "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}",
    "description": "${VAR} or ${VAR:-default}: read from the environment when loaded",
}
_TO_ENV_REF: JsonSchemaValue = {"$ref": f"#/$defs/{ENV_REF_NAME}"}
DURATION: JsonSchemaValue = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {
            "type": "string",
            # As parse_duration reads it: spaces dropped, units in any case.
            "pattern": r"^\s*(\d+(\.\d+)?\s*([mM][sS]|[sSmMhH])?\s*)+$",
        },
    ],
    "description": "seconds, or a duration such as 30s, 5m, 1h30m, 250ms",
}


# -- what the models accept beyond their fields' types --------------------------------


def _duration(*fields: str) -> Callable[[JsonSchemaValue], None]:
    def adjust(schema: JsonSchemaValue) -> None:
        for name in fields:
            _replace(schema, name, DURATION)

    return adjust


def _one_or_many(field: str) -> Callable[[JsonSchemaValue], None]:
    """`tags: smoke` means `tags: [smoke]`."""

    def adjust(schema: JsonSchemaValue) -> None:
        many = schema["properties"][field]
        one = many.get("items", {"type": "string"})
        _replace(schema, field, {"anyOf": [many, one]})

    return adjust


def _adjust_case(schema: JsonSchemaValue) -> None:
    # Where the case was read from, which repetition it is: set by the readers and the
    # submitter, never written in a file.
    for internal in ("source_file", "source_line", "repetition", "max_repeat"):
        schema["properties"].pop(internal, None)
    _one_or_many("tags")(schema)


def _adjust_yaml_test(schema: JsonSchemaValue) -> None:
    _one_or_many("tags")(schema)
    schema["anyOf"] = [{"required": ["user_input"]}, {"required": ["rounds"]}]


def _adjust_agent(schema: JsonSchemaValue) -> None:
    _duration("timeout", "base_delay")(schema)
    _replace(schema, "protocol", {"enum": list(protocol_names())})


def _adjust_project(schema: JsonSchemaValue) -> None:
    schema["properties"].pop("path", None)  # where the file was read from


def _adjust_contains(schema: JsonSchemaValue) -> None:
    _replace(schema, "value", {"type": ["string", "number"]})  # {"value": 3500} finds "3500"


def _adjust_regex(schema: JsonSchemaValue) -> None:
    # `value` is taken for `pattern`, as every other text assertion is written.
    schema["properties"]["value"] = {"type": "string", "description": "the same as `pattern`"}
    schema["required"] = [r for r in schema.get("required", []) if r != "pattern"]
    schema["anyOf"] = [{"required": ["pattern"]}, {"required": ["value"]}]


def _adjust_type(schema: JsonSchemaValue) -> None:
    names = schema["properties"]["value"].get("enum", [])
    _replace(schema, "value", {"enum": [*names, *(a for a in TYPE_ALIASES if a not in names)]})


ADJUSTMENTS: dict[type[BaseModel], Callable[[JsonSchemaValue], None]] = {
    Case: _adjust_case,
    YamlTest: _adjust_yaml_test,
    InteractiveConfig: _duration("timeout"),
    AgentConfig: _adjust_agent,
    ProjectConfig: _adjust_project,
    ContainsAssertion: _adjust_contains,
    RegexAssertion: _adjust_regex,
    TypeAssertion: _adjust_type,
}


def _replace(schema: JsonSchemaValue, field: str, new: JsonSchemaValue) -> None:
    """Field `field` takes `new`, keeping its title, description and default."""
    old = schema["properties"][field]
    kept = {k: old[k] for k in ("title", "description", "default") if k in old}
    schema["properties"][field] = {**new, **kept}


class _EditorSchema(GenerateJsonSchema):
    """pydantic's schema, with what the models accept beyond their fields' types."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Whether the model being generated takes numbers where it expects text.
        self._numbers_as_text: list[bool] = []

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        config = schema.get("config") or {}
        self._numbers_as_text.append(bool(config.get("coerce_numbers_to_str")))
        try:
            json_schema = super().model_schema(schema)
        finally:
            self._numbers_as_text.pop()
        adjust = ADJUSTMENTS.get(schema["cls"])
        if adjust is not None:
            adjust(json_schema)
        return json_schema

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        json_schema = super().str_schema(schema)
        if self._numbers_as_text and self._numbers_as_text[-1]:
            json_schema["type"] = ["string", "number"]  # `user_input: 42` is the text "42"
        return json_schema


def _definitions(*models: type[BaseModel]) -> tuple[list[JsonSchemaValue], JsonSchemaValue]:
    refs, schema = models_json_schema(
        [(m, "validation") for m in models], schema_generator=_EditorSchema
    )
    return [refs[(m, "validation")] for m in models], schema.get("$defs", {})


# -- the three schemas ------------------------------------------------------------------


def cases_schema() -> JsonSchemaValue:
    """A JSON case file: a case, an array of cases or {"cases": [...]}; a JSONL line."""
    [case], defs = _definitions(Case)
    many = {"type": "array", "items": case, "minItems": 1}
    return {
        "$schema": DRAFT,
        "title": "agenttest case file (JSON: a case, an array of cases or {cases}; a JSONL line)",
        "anyOf": [
            case,
            many,
            {"type": "object", "required": ["cases"], "properties": {"cases": many}},
        ],
        "$defs": defs,
    }


def yaml_schema() -> JsonSchemaValue:
    """A tdx YAML case file: `tests:` (flat, rounds or mixed), and an optional `agent:`."""
    [test], defs = _definitions(YamlTest)
    return {
        "$schema": DRAFT,
        "title": "agenttest YAML case file (tdx format)",
        "type": "object",
        "properties": {
            "agent": {"type": "string", "description": "the target of every test in the file"},
            "tests": {"type": "array", "items": test, "minItems": 1},
        },
        "required": ["tests"],
        "additionalProperties": False,
        "$defs": defs,
    }


def config_schema() -> JsonSchemaValue:
    """agenttest.yaml, every value that is not free text also taking a ${VAR}."""
    [project], defs = _definitions(ProjectConfig)
    top = _allow_env_refs(defs.pop(project["$ref"].rsplit("/", 1)[1]))
    return {
        "$schema": DRAFT,
        **top,
        "title": "agenttest.yaml",
        "$defs": {
            **{name: _allow_env_refs(d) for name, d in defs.items()},
            ENV_REF_NAME: ENV_REF,
        },
    }


SCHEMAS: dict[SchemaKind, Callable[[], JsonSchemaValue]] = {
    "cases": cases_schema,
    "yaml": yaml_schema,
    "config": config_schema,
}


def schema_text(kind: SchemaKind) -> str:
    """What `agenttest-submit schema KIND` prints."""
    return json.dumps(SCHEMAS[kind](), indent=2, ensure_ascii=False) + "\n"


# -- ${VAR} wherever agenttest.yaml is interpolated -------------------------------------

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE_SCHEMA = ("items", "additionalProperties", "not")


def _allow_env_refs(schema: Any) -> Any:
    """The schema with ${VAR} also allowed wherever text would otherwise be refused.

    Interpolation replaces references in every string of the file before it is
    validated, so `max_retries: ${RETRIES:-3}` and `protocol: ${PROTOCOL}` are fine.
    """
    if not isinstance(schema, dict):
        return schema
    if _refuses_references(schema):
        kept = {k: schema[k] for k in ("title", "description", "default") if k in schema}
        inner = {k: v for k, v in schema.items() if k not in kept}
        return {**kept, "anyOf": [inner, _TO_ENV_REF]}
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _allow_env_refs(s) for name, s in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_allow_env_refs(s) for s in out[key]]
    if isinstance(out.get("anyOf"), list):
        out["anyOf"] = _one_reference(out["anyOf"])
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _allow_env_refs(out[key])
    return out


def _one_reference(choices: list[Any]) -> list[Any]:
    """anyOf [anyOf [a, ref], anyOf [b, ref]] as anyOf [a, b, ref]: the same, readable."""
    flat: list[Any] = []
    referenced = False
    for choice in choices:
        inner = choice.get("anyOf") if isinstance(choice, dict) else None
        if len(choice) == 1 and isinstance(inner, list) and inner[-1:] == [_TO_ENV_REF]:
            flat.extend(inner[:-1])
            referenced = True
        elif choice == _TO_ENV_REF:
            referenced = True
        else:
            flat.append(choice)
    return [*flat, _TO_ENV_REF] if referenced else flat


def _refuses_references(schema: JsonSchemaValue) -> bool:
    """A leaf a `${VAR}` string would fail: a number, a boolean, a choice, a pattern."""
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        return True
    if kind in ("integer", "number", "boolean"):
        return True
    return kind == "string" and ("pattern" in schema or "minLength" in schema)
