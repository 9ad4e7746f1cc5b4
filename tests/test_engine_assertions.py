"""Every assertion type, passing and failing, through real HTTP and the engine.

Each test scripts a target (tests/scripted_agent.py) or uses a demo agent, plays the
case with the engine (start_conversation / run_turn / case_result) and reads the
assertion results: the verdict and a reason that tells the author what to change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from scripted_agent import (
    Reply,
    ScriptedAgent,
    call,
    demo_entry,
    fail,
    judge_verdict,
    project,
    run_case,
    say,
)

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.cases.case_model import Case
from agenttest_worker.cases.files import load_cases
from agenttest_worker.demo._protocol import metadata_of
from agenttest_worker.engine import RunOptions
from agenttest_worker.results import AssertionResult


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        yield server


def config_for(agent: ScriptedAgent, demo_url: str | None = None, **settings: Any) -> ProjectConfig:
    agents = {name: agent.entry(name) for name in ("target", "judge")}
    if demo_url is not None:
        agents["validator"] = demo_entry(demo_url, "validator")
        agents["expense"] = demo_entry(demo_url, "expense")
    return project(agents, **settings)


def one_turn(
    agent: ScriptedAgent,
    reply: Reply | str,
    assertions: list[dict[str, Any]],
    config: ProjectConfig | None = None,
) -> list[AssertionResult]:
    """The assertion results of a single-turn case whose target answers `reply`."""
    agent.script("target", [reply])
    result, _ = run_case(
        {"id": "A", "input": "go", "assertions": assertions}, config or config_for(agent)
    )
    [turn] = result.turns
    assert turn.error is None, turn.error
    assert turn.status == ("passed" if all(a.passed for a in turn.assertions) else "failed")
    assert result.status == turn.status
    return turn.assertions


def verdicts(results: list[AssertionResult]) -> list[bool]:
    return [r.passed for r in results]


# -- contains, equals, regex -------------------------------------------------------------


def test_contains_is_case_sensitive_unless_ignore_case(agent: ScriptedAgent) -> None:
    results = one_turn(
        agent,
        "Your expense EXP-1 for $3500 was Submitted.",
        [
            {"type": "contains", "value": "EXP-1"},
            {"type": "contains", "value": "submitted"},
            {"type": "contains", "value": "submitted", "ignore_case": True},
            {"type": "contains", "value": 3500},  # a number is matched as its text
            {"type": "contains", "value": "rejected", "ignore_case": True},
        ],
    )
    assert verdicts(results) == [True, False, True, True, False]
    assert results[0].reason == 'reply contains "EXP-1"'
    assert results[1].reason == (
        'reply does not contain "submitted"; reply was '
        '"Your expense EXP-1 for $3500 was Submitted."'
    )
    assert results[4].reason.startswith('reply does not contain "rejected"')
    # The result repeats the assertion as written.
    assert results[2].model_dump()["ignore_case"] is True
    assert results[2].model_dump()["value"] == "submitted"


def test_equals_text_ignores_surrounding_whitespace_only(agent: ScriptedAgent) -> None:
    results = one_turn(
        agent,
        "  OK \n",
        [{"type": "equals", "value": "OK"}, {"type": "equals", "value": "ok"}],
    )
    assert verdicts(results) == [True, False]
    assert results[1].reason == 'expected "ok", got "OK"'


def test_equals_json_value_compares_as_json(agent: ScriptedAgent) -> None:
    results = one_turn(
        agent,
        '{"status": "ok", "count": 1}',
        [
            {"type": "equals", "value": {"count": 1, "status": "ok"}},  # key order is free
            {"type": "equals", "value": {"status": "ok", "count": 1.0}},  # 1 == 1.0
            {"type": "equals", "value": {"status": "ok", "count": True}},  # true is not 1
            {"type": "equals", "value": {"status": "ok"}},
        ],
    )
    assert verdicts(results) == [True, True, False, False]
    assert results[2].reason == (
        'expected {"status": "ok", "count": true}, got {"status": "ok", "count": 1}'
    )


@pytest.mark.parametrize(
    ("reply", "value", "passed", "reason"),
    [
        ("1", True, False, "expected true, got 1"),
        ("true", 1, False, "expected 1, got true"),
        ("true", True, True, "reply equals true"),
        ("1", 1, True, "reply equals 1"),
        ("null", None, True, "reply equals null"),
        ("Approved", True, False, "expected JSON equal to true; reply is not JSON"),
    ],
)
def test_equals_true_is_not_1(
    agent: ScriptedAgent, reply: str, value: Any, passed: bool, reason: str
) -> None:
    [result] = one_turn(agent, reply, [{"type": "equals", "value": value}])
    assert (result.passed, result.reason) == (passed, reason)


def test_regex_uses_re2_syntax(agent: ScriptedAgent) -> None:
    results = one_turn(
        agent,
        "Created order-1234 for Ana, total 35.00",
        [
            {"type": "regex", "pattern": r"order-\d+"},
            {"type": "regex", "pattern": r"ORDER-\d+"},
            {"type": "regex", "pattern": r"ORDER-\d+", "ignore_case": True},
            # RE2/Go syntax that Python's re does not have: Unicode classes, POSIX classes.
            {"type": "regex", "pattern": r"\p{Lu}\p{Ll}+, total [[:digit:]]+\.\d{2}$"},
            {"type": "regex", "value": r"^Created"},  # `value` is accepted for `pattern`
            {"type": "regex", "pattern": r"refund-\d+"},
        ],
    )
    assert verdicts(results) == [True, False, True, True, True, False]
    assert results[0].reason == '/order-\\d+/ matched "order-1234"'
    assert results[3].reason.endswith('matched "Ana, total 35.00"')
    assert results[5].reason == (
        '/refund-\\d+/ did not match; reply was "Created order-1234 for Ana, total 35.00"'
    )
    assert results[4].model_dump()["pattern"] == "^Created"


def test_regex_constructs_re2_lacks_are_load_errors() -> None:
    # Lookaround and backreferences would behave differently from the spec's Go regexp.
    for pattern in (r"order-(?=\d)", r"(a)\1"):
        with pytest.raises(ValidationError, match="invalid regex"):
            Case.model_validate(
                {"id": "R", "input": "x", "assertions": [{"type": "regex", "pattern": pattern}]}
            )


# -- json_path and type ------------------------------------------------------------------

JSON_REPLY = json.dumps(
    {
        "status": "ok",
        "items": [{"id": "a"}, {"id": "b"}],
        "note": None,
        "flag": 1,
        "total": 3500,
    }
)


def test_json_path_on_a_json_reply(agent: ScriptedAgent) -> None:
    results = one_turn(
        agent,
        JSON_REPLY,
        [
            {"type": "json_path", "path": "$.status", "value": "ok"},
            {"type": "json_path", "path": "$.status", "value": "done"},
            {"type": "json_path", "path": "$.items[*].id", "value": ["a", "b"]},
            {"type": "json_path", "path": "$.items[*].id", "value": "b"},
            {"type": "json_path", "path": "$.note", "value": None},
            {"type": "json_path", "path": "$.missing", "value": None},
            {"type": "json_path", "path": "$.flag", "value": True},
            {"type": "json_path", "path": "$.total", "value": 3500.0},
            {"type": "json_path", "path": "$.items"},
            {"type": "json_path", "path": "$.nope"},
            {"type": "json_path", "path": "$.items[?(@.id == 'b')].id", "value": "b"},
        ],
    )
    assert verdicts(results) == [
        True,
        False,
        True,
        True,
        True,
        False,
        False,
        True,
        True,
        False,
        True,
    ]
    assert results[0].reason == '$.status = "ok"'
    assert results[1].reason == '$.status is "ok", expected "done"'
    assert results[4].reason == "$.note = null"
    # null is a value: a path that matches nothing does not equal null.
    assert results[5].reason.startswith("$.missing matched nothing (expected null) in {")
    assert results[6].reason == "$.flag is 1, expected true"
    assert results[9].reason.startswith("$.nope matched nothing in {")
    # `"value": null` as written survives in the result.
    assert results[4].model_dump()["value"] is None
    assert "value" in results[4].model_dump()
    assert "value" not in results[8].model_dump()


def test_json_path_on_a_text_reply_reads_content_and_tool_calls(agent: ScriptedAgent) -> None:
    reply = Reply(
        content="Creating your expense.",
        tool_calls=[{"name": "create_expense", "args": {"amount": 3500, "type": "travel"}}],
    )
    results = one_turn(
        agent,
        reply,
        [
            {"type": "json_path", "path": "$.content", "value": "Creating your expense."},
            {"type": "json_path", "path": "$.tool_calls[0].name", "value": "create_expense"},
            {"type": "json_path", "path": "$.tool_calls[0].args.amount", "value": 3500},
            {"type": "json_path", "path": "$.tool_calls[0].args.amount", "value": "3500"},
            {"type": "json_path", "path": "$.status", "value": "ok"},
            {"type": "type", "path": "$.tool_calls", "value": "array"},
        ],
    )
    assert verdicts(results) == [True, True, True, False, False, True]
    assert results[3].reason == '$.tool_calls[0].args.amount is 3500, expected "3500"'
    # The document a user is told about is the one the assertion read.
    assert '"content": "Creating your expense."' in results[4].reason


def test_type_of_each_json_type_and_aliases(agent: ScriptedAgent) -> None:
    reply = json.dumps({"s": "x", "i": 3, "f": 2.5, "b": True, "a": [1], "o": {"k": 1}, "n": None})
    passing = [
        ("$.s", "string"),
        ("$.i", "integer"),
        ("$.i", "number"),  # every integer is a number
        ("$.f", "number"),
        ("$.b", "boolean"),
        ("$.a", "array"),
        ("$.o", "object"),
        ("$.n", "null"),
        ("$", "object"),
        ("$.s", "str"),
        ("$.i", "int"),
        ("$.f", "float"),
        ("$.b", "bool"),
        ("$.a", "list"),
        ("$.o", "dict"),
        ("$.n", "none"),
        ("$.s", " String "),
    ]
    failing = [("$.f", "integer"), ("$.b", "number"), ("$.i", "string"), ("$.gone", "string")]
    results = one_turn(
        agent,
        reply,
        [{"type": "type", "path": p, "value": v} for p, v in passing + failing]
        + [{"type": "type", "value": "array"}],  # path defaults to $
    )
    assert verdicts(results) == [True] * len(passing) + [False] * (len(failing) + 1)
    reasons = [r.reason for r in results[len(passing) :]]
    assert reasons[0] == "$.f is a number (2.5), expected an integer"
    assert reasons[1] == "$.b is a boolean (true), expected a number"
    assert reasons[2] == "$.i is an integer (3), expected a string"
    assert reasons[3].startswith("$.gone matched nothing in {") and reasons[3].endswith(
        "expected a string"
    )
    assert reasons[4].startswith("$ is an object (")
    # The alias is stored as the JSON type it means.
    assert results[9].model_dump()["value"] == "string"


def test_type_unknown_name_is_a_load_error() -> None:
    with pytest.raises(ValidationError, match="value"):
        Case.model_validate(
            {"id": "T", "input": "x", "assertions": [{"type": "type", "value": "decimal"}]}
        )


def test_final_document_has_turns_last_output_tool_results_and_state(
    agent: ScriptedAgent,
) -> None:
    agent.script(
        "target",
        [
            call("create_expense", {"amount": 3500}),
            say("Draft EXP-1 is ready. Shall I submit it?"),
            say(
                '{"done": true, "reference": "EXP-2025-001"}',
                # `turns` in the state must not hide the conversation's own turns.
                state={"expense": {"status": "submitted"}, "turns": "agent's own"},
            ),
        ],
    )
    final = [
        {"type": "json_path", "path": "$.expense.status", "value": "submitted"},
        {"type": "json_path", "path": "$.state.expense.status", "value": "submitted"},
        {"type": "json_path", "path": "$.state.turns", "value": "agent's own"},
        {"type": "json_path", "path": "$.tool_results.create_expense.id", "value": "EXP-1"},
        {
            "type": "json_path",
            "path": "$.turns[0].content",
            "value": "Draft EXP-1 is ready. Shall I submit it?",
        },
        {"type": "json_path", "path": "$.turns[0].tool_calls[0].name", "value": "create_expense"},
        {"type": "json_path", "path": "$.turns[1].reference", "value": "EXP-2025-001"},
        {"type": "json_path", "path": "$.last_output.done", "value": True},
        {"type": "type", "path": "$.turns", "value": "array"},
        {"type": "json_path", "path": "$.expense.status", "value": "draft"},
        {"type": "tool_called", "name": "create_expense", "args": {"amount": 3500}},
        {"type": "contains", "value": "EXP-2025-001"},  # text assertions read the last reply
    ]
    result, _ = run_case(
        {
            "id": "F",
            "turns": [{"input": "File $3500"}, {"input": "Yes"}],
            "tool_mocks": {"create_expense": {"id": "EXP-1", "status": "draft"}},
            "final_assertions": final,
        },
        config_for(agent),
    )
    assert verdicts(result.final_assertions) == [True] * 9 + [False, True, True]
    assert result.final_assertions[9].reason == '$.expense.status is "submitted", expected "draft"'
    assert result.status == "failed"
    assert result.turns[1].status == "passed"  # the final assertion failed, not a turn


def test_final_document_last_output_is_text_when_not_json(agent: ScriptedAgent) -> None:
    agent.script("target", ["All done."])
    result, _ = run_case(
        {
            "id": "F",
            "input": "hi",
            "final_assertions": [
                {"type": "json_path", "path": "$.last_output", "value": "All done."},
                {"type": "json_path", "path": "$.state", "value": None},
                {"type": "json_path", "path": "$.tool_results", "value": {}},
            ],
        },
        config_for(agent),
    )
    assert verdicts(result.final_assertions) == [True, True, True]


# -- tool_called -------------------------------------------------------------------------


def test_tool_called_by_name_and_args_subset(agent: ScriptedAgent) -> None:
    reply = Reply(
        tool_calls=[
            {"name": "create_expense", "args": {"amount": 3500, "type": "travel", "memo": "x"}},
            {"name": "get_policy", "args": {}},
        ]
    )
    results = one_turn(
        agent,
        reply,
        [
            {"type": "tool_called", "name": "create_expense"},
            {"type": "tool_called", "name": "create_expense", "args": {"amount": 3500}},
            {
                "type": "tool_called",
                "name": "create_expense",
                "args": {"amount": 3500, "type": "travel"},
            },
            {"type": "tool_called", "name": "create_expense", "args": {"amount": 100}},
            {"type": "tool_called", "name": "create_expense", "args": {"currency": "EUR"}},
            {"type": "tool_called", "name": "delete_expense"},
        ],
    )
    assert verdicts(results) == [True, True, True, False, False, False]
    assert results[1].reason == 'create_expense was called with {"amount": 3500}'
    assert results[3].reason == (
        'create_expense was called, but not with {"amount": 100} '
        '(args: {"amount": 3500, "type": "travel", "memo": "x"})'
    )
    assert results[5].reason == (
        "delete_expense was not called in this turn (called: create_expense, get_policy)"
    )


def test_tool_called_is_per_turn_and_per_conversation_in_final(agent: ScriptedAgent) -> None:
    agent.script("target", [call("create_expense", {"amount": 1}), "Anything else?"])
    result, _ = run_case(
        {
            "id": "TC",
            "turns": [
                {"input": "file it"},
                {
                    "input": "no",
                    "assertions": [{"type": "tool_called", "name": "create_expense"}],
                },
            ],
            "on_missing_input": "end",
            "final_assertions": [{"type": "tool_called", "name": "create_expense"}],
        },
        config_for(agent),
    )
    [turn_check] = result.turns[1].assertions
    assert not turn_check.passed
    assert turn_check.reason == "create_expense was not called in this turn (called: none)"
    assert result.final_assertions[0].passed


# -- agent (judges) ----------------------------------------------------------------------


def test_agent_assertion_with_the_demo_validator(agent: ScriptedAgent, demo_url: str) -> None:
    results = one_turn(
        agent,
        "Hello! I can help you submit expense reports.",
        [
            {
                "type": "agent",
                "use": "agents:validator",
                "options": {"metadata": {"criteria": 'Mentions "expense reports"'}},
            },
            {
                "type": "agent",
                "use": "validator",
                "options": {
                    "metadata": {"criteria": 'Mentions "refund" and does not mention "Hello"'}
                },
            },
        ],
        config_for(agent, demo_url),
    )
    assert verdicts(results) == [True, False]
    # The demo validator answers inside a ```json fence after a line of prose.
    assert results[0].reason == 'found "expense reports"'
    assert results[0].score == 1.0
    assert results[1].reason == 'missing "refund"; present though forbidden "Hello"'
    assert results[1].score == 0.0
    assert results[1].suggestions == ["refund", 'do not mention "Hello"']
    assert results[1].error is None


def test_judge_reply_in_a_code_fence_is_parsed(agent: ScriptedAgent) -> None:
    fenced = (
        "Sure, here is my verdict.\n```json\n"
        + json.dumps({"passed": False, "score": 0.25, "reason": "too terse", "suggestions": ["x"]})
        + "\n```\nLet me know if you need more."
    )
    agent.script("judge", [fenced])
    [result] = one_turn(
        agent,
        "Done.",
        [{"type": "agent", "use": "agents:judge", "options": {"metadata": {"criteria": "c"}}}],
    )
    assert (result.passed, result.reason, result.score, result.suggestions) == (
        False,
        "too terse",
        0.25,
        ["x"],
    )
    assert result.error is None


def test_judge_gets_the_spec_validator_request(agent: ScriptedAgent) -> None:
    agent.script("judge", [judge_verdict(True, "fine")])
    [result] = one_turn(
        agent,
        "The answer is 42.",
        [
            {
                "type": "agent",
                "use": "agents:judge",
                "options": {"metadata": {"criteria": "Answers the question", "tone": "terse"}},
            }
        ],
    )
    assert result.passed and result.reason == "fine"
    [request] = agent.requests("judge")
    assert metadata_of(request) == {
        "test_mode": "validator",
        "test_id": "A",
        "criteria": "Answers the question",
        "tone": "terse",
    }
    system, *conversation = request["messages"]
    assert system["role"] == "system" and "Answers the question" in system["content"]
    assert conversation == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "The answer is 42."},
    ]


YAML_ROUNDS = """\
tests:
  - name: context_memory
    rounds:
      - user_input: My name is Alice
        criteria: Should acknowledge the name
      - user_input: What's my name?
        criteria: Should remember and respond with Alice
"""


def test_yaml_criteria_use_the_default_judge_over_the_whole_conversation(
    agent: ScriptedAgent, tmp_path: Path
) -> None:
    (tmp_path / "memory.yaml").write_text(YAML_ROUNDS, encoding="utf-8")
    [case] = load_cases(tmp_path / "memory.yaml")
    agent.script("target", ["Nice to meet you, Alice.", "Your name is Alice."])
    agent.script("judge", [judge_verdict(True, "acknowledged"), judge_verdict(False, "forgot")])
    result, _ = run_case(case, config_for(agent, defaults={"judge": "judge"}))
    assert [t.assertions[0].passed for t in result.turns] == [True, False]
    assert result.turns[1].assertions[0].reason == "forgot"
    first, second = agent.requests("judge")
    assert metadata_of(first)["criteria"] == "Should acknowledge the name"
    assert metadata_of(second)["criteria"] == "Should remember and respond with Alice"
    # The second judgement sees the conversation so far, not just the last exchange.
    assert second["messages"][1:] == [
        {"role": "user", "content": "My name is Alice"},
        {"role": "assistant", "content": "Nice to meet you, Alice."},
        {"role": "user", "content": "What's my name?"},
        {"role": "assistant", "content": "Your name is Alice."},
    ]
    assert "whole conversation" in second["messages"][0]["content"]


def test_yaml_criteria_with_the_demo_validator_as_default_judge(
    agent: ScriptedAgent, demo_url: str, tmp_path: Path
) -> None:
    (tmp_path / "greet.yaml").write_text(
        "tests:\n"
        "  - name: greeting\n"
        "    user_input: Hi\n"
        '    criteria: Must say "expense reports" and never "sorry"\n',
        encoding="utf-8",
    )
    [case] = load_cases(tmp_path / "greet.yaml")
    result, _ = run_case(
        case,
        config_for(agent, demo_url, defaults={"judge": "validator"}),
        RunOptions(target="expense"),  # the demo expense agent this time
    )
    [check] = result.turns[0].assertions
    assert check.passed, check.reason
    assert check.reason == 'found "expense reports"; avoided "sorry"'
    assert result.status == "passed"


def test_a_judge_that_errors_fails_the_assertion_not_the_run(agent: ScriptedAgent) -> None:
    agent.script("target", ["First answer.", "Second answer."])
    agent.script(
        "judge",
        [fail(500, "judge overloaded", headers={"Retry-After": "0"})] * 2
        + ["I think it is fine, really."],
    )
    judged = {"type": "agent", "use": "agents:judge", "options": {"metadata": {"criteria": "c"}}}
    result, _ = run_case(
        {
            "id": "J",
            "turns": [
                {"input": "one", "assertions": [judged]},
                {"input": "two", "assertions": [judged, {"type": "contains", "value": "Second"}]},
            ],
        },
        config_for(agent),
    )
    first, second = result.turns
    [broken] = first.assertions
    assert not broken.passed
    assert broken.reason.startswith("judge judge failed: agent error: HTTP 500 from judge")
    assert "judge overloaded" in broken.reason and "(after 2 attempts)" in broken.reason
    assert broken.error is not None and "HTTP 500" in broken.error
    # The conversation went on: turn 2 was sent and its other assertions ran.
    assert first.error is None and second.input == "two"
    junk, contains = second.assertions
    assert not junk.passed
    assert junk.reason.startswith('judge judge: reply is not JSON: "I think it is fine')
    assert contains.passed
    assert result.status == "failed" and result.error is None
    assert [c.role for c in first.calls or []] == ["target", "validator"]


def test_agent_assertion_without_a_judge_says_how_to_configure_one(agent: ScriptedAgent) -> None:
    [result] = one_turn(agent, "x", [{"type": "agent", "options": {"metadata": {"criteria": "c"}}}])
    assert not result.passed
    assert result.reason == "no judge: set defaults.judge in agenttest.yaml"


# -- script ------------------------------------------------------------------------------

CHECKS = """\
def amount_ok(response, metadata):
    return response["document"]["amount"] <= metadata["max_amount"]


def detailed(response, metadata):
    amount = response["document"]["amount"]
    limit = metadata["max_amount"]
    if amount > limit:
        return {"passed": False, "reason": f"amount {amount} is over {limit}", "score": 0.2}
    return {"passed": True, "reason": "within the limit", "score": 1}


def broken(response, metadata):
    raise RuntimeError("policy service unavailable")


def vague(response, metadata):
    return "looks fine"


def sees_everything(response, metadata):
    return (
        response["input"] == "go"
        and response["output"] == '{"amount": 3500}'
        and response["case_id"] == "A"
        and response["final"] is False
        and response["messages"][-1]["role"] == "assistant"
        and response["tool_calls"] == []
    )
"""


def test_script_assertions_bool_dict_and_raising(agent: ScriptedAgent, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    (scripts / "tests").mkdir(parents=True)
    (scripts / "checks.py").write_text(CHECKS, encoding="utf-8")
    # The spec's own naming: scripts:tests.validate-expense -> tests/validate-expense.py
    (scripts / "tests" / "validate-expense.py").write_text(
        "def validate(response, metadata):\n    return response['document']['amount'] > 0\n",
        encoding="utf-8",
    )
    limit = {"options": {"metadata": {"max_amount": 1000}}}
    results = one_turn(
        agent,
        '{"amount": 3500}',
        [
            {"type": "script", "use": "scripts:checks.amount_ok", **limit},
            {
                "type": "script",
                "use": "scripts:checks.amount_ok",
                "options": {"metadata": {"max_amount": 5000}},
            },
            {"type": "script", "use": "scripts:checks.detailed", **limit},
            {"type": "script", "use": "scripts:checks.broken", **limit},
            {"type": "script", "use": "scripts:checks.vague", **limit},
            {"type": "script", "use": "scripts:checks.sees_everything"},
            {"type": "script", "use": "scripts:tests.validate-expense"},
            {"type": "script", "use": "scripts:checks.missing_function"},
        ],
        config_for(agent, scripts_dir=str(scripts)),
    )
    assert verdicts(results) == [False, True, False, False, False, True, True, False]
    assert results[0].reason == "script checks.amount_ok returned false"
    assert results[1].reason == "script checks.amount_ok returned true"
    assert (results[2].reason, results[2].score) == ("amount 3500 is over 1000", 0.2)
    assert results[3].reason == (
        "script checks.broken raised RuntimeError: policy service unavailable"
    )
    assert results[3].error == results[3].reason
    assert results[4].reason.startswith("script checks.vague returned 'looks fine'; expected")
    assert "has no function missing_function()" in results[7].reason
