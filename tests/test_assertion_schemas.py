"""Every assertion type's schema: the spec's examples, and a typo in each, located by field.

Validation goes through the case reader (validate_case) so the messages are the ones the
CLI prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agenttest_worker.agents.options import Options
from agenttest_worker.assertions import (
    AgentAssertion,
    ContainsAssertion,
    EqualsAssertion,
    GoldenAssertion,
    JsonPathAssertion,
    RegexAssertion,
    ScriptAssertion,
    ToolCalledAssertion,
    TypeAssertion,
)
from agenttest_worker.cases.case_model import Case
from agenttest_worker.cases.files import Located, load_cases, validate_case
from agenttest_worker.errors import InputProblem

SPEC = Path(__file__).parent / "fixtures" / "spec"
KNOWN = (
    "contains, equals, regex, not_contains, not_regex, json_path, type, tool_called, "
    "tool_not_called, agent, script, latency, tool_sequence, tool_count, turn_count, "
    "trace_tool_called, trace_span_count, trace_error_spans, trace_duration, not, any, all, golden"
)
JSON_TYPES = "'string', 'number', 'integer', 'boolean', 'array', 'object' or 'null'"


def check(assertion: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(field, message) of each problem with one assertion on a single-turn case."""
    items = list(
        validate_case(Located({"id": "A", "input": "x", "assertions": [assertion]}, "a.jsonl", 1))
    )
    assert all(isinstance(i, InputProblem) for i in items), items
    for item in items:
        assert isinstance(item, InputProblem)
        assert (item.file, item.line, item.test) == ("a.jsonl", 1, "A")
    return [(i.field, i.message) for i in items if isinstance(i, InputProblem)]


def parse(assertion: dict[str, Any]) -> Any:
    [item] = list(
        validate_case(Located({"id": "A", "input": "x", "assertions": [assertion]}, "a.jsonl", 1))
    )
    assert isinstance(item, Case), item
    [parsed] = item.turns[0].assertions
    return parsed


# -- the spec's examples ------------------------------------------------------------------


def test_spec_assertion_examples() -> None:
    cases = {c.id: c.turns[0].assertions for c in load_cases(SPEC / "assertion_examples.jsonl")}
    assert cases == {
        "A-contains": [ContainsAssertion(type="contains", value="success")],
        "A-equals": [EqualsAssertion(type="equals", value="OK")],
        "A-regex": [RegexAssertion(type="regex", pattern="order-\\d+")],
        "A-json_path": [JsonPathAssertion(type="json_path", path="$.status", value="ok")],
        "A-tool_called": [ToolCalledAssertion(type="tool_called", name="create_expense")],
        "A-type": [TypeAssertion(type="type", path="$.count", value="number")],
        "A-agent": [
            AgentAssertion(
                type="agent",
                use="agents:workers.test.validator",
                options=Options(
                    connector="openai-gpt4",
                    metadata={
                        "criteria": "Response should be helpful and answer the user's question",
                        "expected_intent": "provide expense submission guidance",
                        "tone": "professional and friendly",
                    },
                ),
            )
        ],
        "A-script": [
            ScriptAssertion(
                type="script",
                use="scripts:tests.validate-expense",
                options=Options(metadata={"min_amount": 100, "max_amount": 10000}),
            )
        ],
        "A-combined": [
            ToolCalledAssertion(type="tool_called", name="create_expense"),
            AgentAssertion(
                type="agent",
                use="agents:workers.test.validator",
                options=Options(
                    metadata={
                        "criteria": "Confirmation message should include expense amount and "
                        "be polite"
                    }
                ),
            ),
        ],
    }
    agent = cases["A-agent"][0]
    assert isinstance(agent, AgentAssertion) and agent.conversation is False


@pytest.mark.parametrize(
    ("assertion", "model", "fields"),
    [
        (
            {"type": "contains", "value": "a", "ignore_case": True, "description": "d"},
            ContainsAssertion,
            {"value": "a", "ignore_case": True, "description": "d"},
        ),
        ({"type": "contains", "value": 3500}, ContainsAssertion, {"value": "3500"}),
        ({"type": "equals", "value": {"ok": True}}, EqualsAssertion, {"value": {"ok": True}}),
        ({"type": "equals", "value": None}, EqualsAssertion, {"value": None}),
        (
            {"type": "regex", "pattern": "EXP-\\d{4}", "ignore_case": True},
            RegexAssertion,
            {"pattern": "EXP-\\d{4}", "ignore_case": True},
        ),
        # `value` is accepted for `pattern`, as every other text assertion uses it
        ({"type": "regex", "value": "order-[0-9]+"}, RegexAssertion, {"pattern": "order-[0-9]+"}),
        (
            {"type": "json_path", "path": "$.items[?(@.qty > 1)].id"},
            JsonPathAssertion,
            {"path": "$.items[?(@.qty > 1)].id", "value": None, "expects_value": False},
        ),
        (
            {"type": "json_path", "path": "$.a", "value": None},
            JsonPathAssertion,
            {"value": None, "expects_value": True},
        ),
        ({"type": "type", "value": "object"}, TypeAssertion, {"path": "$", "value": "object"}),
        (
            {"type": "tool_called", "name": "create_expense", "args": {"amount": 3500}},
            ToolCalledAssertion,
            {"name": "create_expense", "args": {"amount": 3500}},
        ),
        ({"type": "agent"}, AgentAssertion, {"use": None, "options": None, "conversation": False}),
        (
            {"type": "agent", "use": "workers.test.validator", "conversation": True},
            AgentAssertion,
            {"use": "agents:workers.test.validator", "conversation": True},
        ),
        (
            {"type": "script", "use": "tests.validate-expense"},
            ScriptAssertion,
            {"use": "scripts:tests.validate-expense", "options": None},
        ),
        (
            {"type": "golden"},
            GoldenAssertion,
            {"match": "tools", "args": "exact", "use": None, "recorded": None},
        ),
        (
            {"type": "golden", "match": "judge", "use": "validator"},
            GoldenAssertion,
            {"match": "judge", "use": "agents:validator"},
        ),
    ],
)
def test_valid_assertions(assertion: dict[str, Any], model: type, fields: dict[str, Any]) -> None:
    parsed = parse(assertion)
    assert type(parsed) is model
    for name, value in fields.items():
        assert getattr(parsed, name) == value, name


# -- typos: unknown field, missing required field -----------------------------------------


@pytest.mark.parametrize(
    ("assertion", "problems"),
    [
        (
            {"type": "contains", "valeu": "x"},
            [
                ("assertions[0].value", "required field is missing"),
                ("assertions[0].valeu", "unknown field (a typo?)"),
            ],
        ),
        (
            {"type": "contains", "value": "x", "ignorecase": True},
            [("assertions[0].ignorecase", "unknown field (a typo?)")],
        ),
        ({"type": "equals"}, [("assertions[0].value", "required field is missing")]),
        (
            {"type": "equals", "value": "OK", "strict": True},
            [("assertions[0].strict", "unknown field (a typo?)")],
        ),
        ({"type": "regex"}, [("assertions[0].pattern", "required field is missing")]),
        (
            {"type": "regex", "pattern": "a", "flags": "i"},
            [("assertions[0].flags", "unknown field (a typo?)")],
        ),
        (
            {"type": "json_path", "value": "ok"},
            [("assertions[0].path", "required field is missing")],
        ),
        (
            {"type": "json_path", "path": "$.a", "expected": 1},
            [("assertions[0].expected", "unknown field (a typo?)")],
        ),
        (
            {"type": "type", "path": "$.count"},
            [("assertions[0].value", "required field is missing")],
        ),
        (
            {"type": "type", "path": "$.count", "value": "number", "nullable": True},
            [("assertions[0].nullable", "unknown field (a typo?)")],
        ),
        ({"type": "tool_called"}, [("assertions[0].name", "required field is missing")]),
        (
            {"type": "tool_called", "name": "x", "arguments": {}},
            [("assertions[0].arguments", "unknown field (a typo?)")],
        ),
        (
            {"type": "agent", "criteria": "be nice"},
            [("assertions[0].criteria", "unknown field (a typo?)")],
        ),
        (
            {"type": "agent", "options": {"metadta": {}}},
            [("assertions[0].options.metadta", "unknown field (a typo?)")],
        ),
        ({"type": "script"}, [("assertions[0].use", "required field is missing")]),
        (
            {"type": "script", "use": "scripts:x", "metadata": {}},
            [("assertions[0].metadata", "unknown field (a typo?)")],
        ),
        (
            {"type": "golden", "mtach": "exact"},
            [("assertions[0].mtach", "unknown field (a typo?)")],
        ),
    ],
)
def test_typos_in_each_type(assertion: dict[str, Any], problems: list[tuple[str, str]]) -> None:
    assert check(assertion) == problems


@pytest.mark.parametrize(
    ("assertion", "problem"),
    [
        (
            {"type": "Contains", "value": "x"},
            ("assertions[0]", f"unknown assertion type 'Contains' (known: {KNOWN})"),
        ),
        ({"value": "x"}, ("assertions[0]", f"assertion has no `type` (known: {KNOWN})")),
        (
            {"type": "agent", "use": "scripts:tests.judge"},
            (
                "assertions[0].use",
                "'scripts:tests.judge': an agent assertion uses agents:NAME "
                "(scripts go in type script)",
            ),
        ),
        (
            {"type": "script", "use": "agents:workers.test.validator"},
            (
                "assertions[0].use",
                "'agents:workers.test.validator': a script assertion uses scripts:NAME",
            ),
        ),
        (
            {"type": "script", "use": "scripts:../../etc/passwd"},
            (
                "assertions[0].use",
                "'scripts:../../etc/passwd': '../../etc/passwd' is not a valid "
                "name (letters, digits, '.', '-', '_'; no paths)",
            ),
        ),
        (
            {"type": "agent", "use": "agents:judge?strict=1"},
            (
                "assertions[0].use",
                "'agents:judge?strict=1': query parameters are only allowed on -i generator inputs",
            ),
        ),
        (
            {"type": "contains", "value": ["a"]},
            ("assertions[0].value", "Input should be a valid string"),
        ),
        (
            {"type": "tool_called", "name": "x", "args": ["amount"]},
            ("assertions[0].args", "Input should be a valid dictionary"),
        ),
        (
            {"type": "golden", "match": "fuzzy"},
            ("assertions[0].match", "Input should be 'exact', 'tools' or 'judge'"),
        ),
        (
            {"type": "golden", "use": "scripts:x"},
            ("assertions[0].use", "'scripts:x': the judge of a golden assertion is agents:NAME"),
        ),
    ],
)
def test_other_assertion_mistakes(assertion: dict[str, Any], problem: tuple[str, str]) -> None:
    assert check(assertion) == [problem]


# -- regexes RE2 rejects, JSONPaths that do not parse ------------------------------------


@pytest.mark.parametrize(
    ("pattern", "detail"),
    [
        ("(?=order)[0-9]+", "invalid perl operator: (?="),
        ("(?<!x)y", "invalid perl operator: (?<!"),
        ("(a)\\1", "invalid escape sequence: \\1"),
        ("a++", "bad repetition operator: ++"),
        ("[a-", "missing ]: [a-"),
        ("(unclosed", "missing ): (unclosed"),
    ],
)
def test_regex_that_re2_rejects(pattern: str, detail: str) -> None:
    assert check({"type": "regex", "pattern": pattern}) == [
        ("assertions[0].pattern", f"invalid regex {pattern!r}: {detail}")
    ]
    # the same through the `value` spelling
    assert check({"type": "regex", "value": pattern}) == [
        ("assertions[0].pattern", f"invalid regex {pattern!r}: {detail}")
    ]


@pytest.mark.parametrize("path", ["$.[", "$..", "$.items[?(@.qty >]", "$[1:2:3:4]"])
@pytest.mark.parametrize("kind", ["json_path", "type"])
def test_jsonpath_that_does_not_parse(path: str, kind: str) -> None:
    [(field, message)] = check({"type": kind, "path": path, "value": "number"})
    assert field == "assertions[0].path"
    assert message.startswith(f"invalid JSONPath {path!r}: ")


def test_final_assertions_are_checked_too() -> None:
    items = list(
        validate_case(
            Located(
                {
                    "id": "F",
                    "turns": [{"input": "x"}],
                    "final_assertions": [
                        {"type": "json_path", "path": "$.ok"},
                        {"type": "regex", "pattern": "(?=x)"},
                    ],
                },
                "f.jsonl",
                4,
            )
        )
    )
    assert items == [
        InputProblem(
            "invalid regex '(?=x)': invalid perl operator: (?=",
            file="f.jsonl",
            line=4,
            field="final_assertions[1].pattern",
            test="F",
        )
    ]


# -- type-name aliases --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("string", "string"),
        ("str", "string"),
        ("text", "string"),
        ("number", "number"),
        ("float", "number"),
        ("double", "number"),
        ("numeric", "number"),
        ("integer", "integer"),
        ("int", "integer"),
        ("boolean", "boolean"),
        ("bool", "boolean"),
        ("array", "array"),
        ("list", "array"),
        ("object", "object"),
        ("dict", "object"),
        ("map", "object"),
        ("null", "null"),
        ("none", "null"),
        ("nil", "null"),
        ("Integer", "integer"),
        (" Number ", "number"),
        ("BOOL", "boolean"),
    ],
)
def test_type_name_aliases(written: str, meant: str) -> None:
    parsed = parse({"type": "type", "path": "$.x", "value": written})
    assert type(parsed) is TypeAssertion and parsed.value == meant
    # the record holds the canonical name, so it reads back the same
    assert parsed.model_dump(exclude_unset=True) == {"type": "type", "path": "$.x", "value": meant}


@pytest.mark.parametrize("written", ["integr", "date", "", 5])
def test_unknown_type_name(written: Any) -> None:
    assert check({"type": "type", "path": "$.x", "value": written}) == [
        ("assertions[0].value", f"Input should be {JSON_TYPES}")
    ]
