"""What a turn records when something in it went wrong that is not an agent error:
malformed tool calls in the reply (`problems`, with the raw text) and failing
assertions (`assertion_errors`, the spec's error table), over real HTTP."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest
from agent_servers import AgentServer, completion
from agent_servers import Reply as ServerReply
from scripted_agent import Reply, ScriptedAgent, project, run_case, say

from agenttest_worker.report import RunReport, render
from agenttest_worker.results import CaseResult


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        yield server


def _raw(message: dict[str, Any]) -> Reply:
    """A completion whose message is sent exactly as given (tool_calls included)."""
    return Reply(raw=completion(**message))


def _two_turns(agent: ScriptedAgent, first: Reply) -> CaseResult:
    agent.script("target", [first, say("Done.")])
    case = {
        "id": "M",
        "type": "multi_turn",
        "turns": [{"input": "file it"}, {"input": "and then?"}],
    }
    result, _ = run_case(case, project({"target": agent.entry("target")}))
    return result


# -- 16: malformed tool calls ------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_calls", "raw_text", "kept"),
    [
        # Arguments that are not JSON: the call is kept with its raw arguments.
        (
            [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "create_expense", "arguments": "{amount: 5"},
                }
            ],
            "{amount: 5",
            ["create_expense"],
        ),
        # A call without a name cannot be kept as a call: its raw JSON is the problem.
        (
            [
                {"id": "c1", "type": "function", "function": {"arguments": '{"a": 1}'}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_policy", "arguments": "{}"},
                },
            ],
            '"arguments": "{\\"a\\": 1}"',
            ["get_policy"],
        ),
        # `tool_calls` that is not a list at all.
        ("create_expense(amount=5)", "create_expense(amount=5)", []),
        # An item that is not an object.
        (["create_expense"], '"create_expense"', []),
    ],
    ids=["arguments-not-json", "no-name", "not-a-list", "item-not-an-object"],
)
def test_malformed_tool_calls_are_a_turn_problem_with_the_raw_text(
    agent: ScriptedAgent, tool_calls: Any, raw_text: str, kept: list[str]
) -> None:
    result = _two_turns(agent, _raw({"content": "Filed.", "tool_calls": tool_calls}))
    first, second = result.turns
    assert first.problems, "a malformed tool call must not vanish silently"
    assert any(raw_text in problem for problem in first.problems), first.problems
    assert [call.name for call in first.tool_calls] == kept
    # The turn fails, and so does the case; the conversation goes on, as after a failed
    # assertion: the rest of the reply was usable.
    assert first.status == "failed" and first.error is None
    assert result.status == "failed"
    assert second.output == "Done." and second.status == "passed"
    assert "problems" not in json.loads(result.to_json_line())["turns"][1]


def test_well_formed_tool_calls_record_no_problem(agent: ScriptedAgent) -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "get_policy", "arguments": ""}},
    ]
    result = _two_turns(agent, _raw({"content": None, "tool_calls": calls}))
    assert result.turns[0].problems is None
    assert result.status == "passed"
    assert "problems" not in json.loads(result.to_json_line())["turns"][0]


def test_an_http_agents_malformed_tool_calls_are_a_turn_problem() -> None:
    with AgentServer() as server:
        server.always("/chat", ServerReply(body={"content": "ok", "tool_calls": {"name": "x"}}))
        config = project(
            {"target": {"protocol": "http", "url": server.url("/chat"), "max_retries": 0}}
        )
        result, _ = run_case({"id": "H", "input": "go"}, config)
    [turn] = result.turns
    assert turn.status == "failed"
    assert turn.problems is not None and '{"name": "x"}' in turn.problems[0]


# -- 18: assertion_errors ------------------------------------------------------------------


def test_a_failed_turn_carries_its_failing_assertions_reasons(agent: ScriptedAgent) -> None:
    agent.script("target", [say("Your expense was filed."), say("Reference EXP-1.")])
    case = {
        "id": "A",
        "type": "multi_turn",
        "turns": [
            {
                "input": "file it",
                "assertions": [
                    {"type": "contains", "value": "filed"},
                    {"type": "contains", "value": "rejected"},
                    {"type": "regex", "pattern": "^EXP"},
                ],
            },
            {"input": "reference?", "assertions": [{"type": "contains", "value": "EXP-1"}]},
        ],
    }
    result, _ = run_case(case, project({"target": agent.entry("target")}))
    first, second = result.turns
    failing = [a.reason for a in first.assertions if not a.passed]
    assert len(failing) == 2
    assert first.assertion_errors == failing
    assert first.status == "failed"
    assert second.assertion_errors is None
    record = json.loads(result.to_json_line())
    assert record["turns"][0]["assertion_errors"] == failing
    assert "assertion_errors" not in record["turns"][1]


def test_every_report_format_says_what_was_malformed(agent: ScriptedAgent) -> None:
    """A turn failed by a malformed call says why, not just FAILED, wherever it is shown."""
    calls = [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}]
    result = _two_turns(agent, _raw({"content": "Filed.", "tool_calls": calls}))
    run = RunReport(
        results=[result], agent="target", input_label="cases", total_cases=1, duration_s=1.0
    )
    console = render("console", run)
    assert "Problem: tool call 1 has no name:" in console
    first_row = render("table", run).splitlines()[1]
    assert "turn 1: tool call 1 has no name" in first_row
    assert "turn 1: tool call 1 has no name" in render("tsv", run)
    failure = ET.fromstring(render("junit", run)).find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.get("message", "").startswith("turn 1: tool call 1 has no name")
