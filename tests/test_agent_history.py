"""History-based http agents: replies read back from the agent's chat history (tdx).

The agent (tests/stream_servers.py HistoryAgent) answers each input with an
acknowledgement and writes what it did to a chat history: several assistant messages,
a tool call and its result per round. `history: {when: turn}` reads it after every turn,
`when: end` once after the last static turn, as tdx's runner does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import project, run_case
from stream_servers import HistoryAgent

from agenttest_submit.cli.main import main
from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.results import ToolCall

SEARCH = {
    "id": "t1",
    "type": "function",
    "function": {"name": "search_flights", "arguments": '{"to": "Oslo"}'},
}
ROUNDS = [
    [
        {"role": "assistant", "content": "Let me look that up."},
        {"role": "assistant", "content": None, "tool_calls": [SEARCH]},
        {"role": "tool", "tool_call_id": "t1", "content": '{"flights": 3}'},
        {"role": "assistant", "content": "I found 3 flights. Which one?"},
    ],
    [{"role": "assistant", "content": "Booked flight 2."}],
]


@pytest.fixture
def agent() -> Iterator[HistoryAgent]:
    with HistoryAgent(ROUNDS) as running:
        yield running


def entry(agent: HistoryAgent, when: str) -> dict[str, Any]:
    return {
        "protocol": "http",
        "url": agent.base_url + "/chat",
        "request": {"session_id": "{{session_id}}", "input": "{{input}}"},
        "history": {"url": agent.base_url + "/history?session={{session_id}}", "when": when},
        "timeout": 2,
        "max_retries": 0,
    }


def booking_case(second_turn: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "H1",
        "turns": [
            {
                "input": "Find me a flight to Oslo",
                "assertions": [
                    {"type": "contains", "value": "found 3 flights"},
                    {"type": "contains", "value": "look that up"},
                    {"type": "tool_called", "name": "search_flights"},
                    {"type": "json_path", "path": "$.events[2].content", "value": '{"flights": 3}'},
                ],
            },
            second_turn
            or {
                "input": "The second one",
                "assertions": [{"type": "equals", "value": "Booked flight 2."}],
            },
        ],
        "final_assertions": [
            {"type": "json_path", "path": "$.tool_results.search_flights.flights", "value": 3}
        ],
    }


@pytest.mark.parametrize("when", ["turn", "end"])
def test_each_turn_gets_its_round_with_several_messages_and_tool_events(
    agent: HistoryAgent, when: str
) -> None:
    result, state = run_case(booking_case(), project({"target": entry(agent, when)}))
    first, second = result.turns
    assert result.status == "passed", [t.assertions for t in result.turns]
    assert first.output == "Let me look that up.\n\nI found 3 flights. Which one?"
    assert first.events == ROUNDS[0]  # in order, as the history wrote them
    assert first.tool_calls == [ToolCall(name="search_flights", args={"to": "Oslo"}, id="t1")]
    assert first.tool_results == {"search_flights": {"flights": 3}}
    assert second.output == "Booked flight 2." and second.events == ROUNDS[1]
    assert [a.passed for a in first.assertions] == [True, True, True, True]
    gets = [path for method, path in agent.received if method == "GET"]
    assert gets == ["/history?session=session-H1"] * (2 if when == "turn" else 1)
    # The conversation the judges read holds the history's replies.
    assert [m["content"] for m in state.messages if m["role"] == "assistant"] == [
        first.output,
        second.output,
    ]
    record = json.loads(result.to_json_line())
    assert record["turns"][0]["events"] == ROUNDS[0]


def test_an_assertion_that_fails_on_a_held_turn_fails_the_case(agent: HistoryAgent) -> None:
    case = booking_case()
    case["turns"][0]["assertions"] = [{"type": "contains", "value": "no such text"}]
    result, _ = run_case(case, project({"target": entry(agent, "end")}))
    assert result.status == "failed"
    first, second = result.turns
    assert first.status == "failed" and not first.assertions[0].passed
    assert second.status == "passed"


def test_a_history_with_too_few_rounds_fails_the_turn_saying_so(agent: HistoryAgent) -> None:
    # A history URL that names another session: its history has no input at all.
    settings = entry(agent, "turn")
    settings["history"]["url"] = agent.base_url + "/history?session=someone-else"
    result, _ = run_case({"id": "H2", "input": "Hello"}, project({"target": settings}))
    [turn] = result.turns
    assert result.status == "failed"
    assert turn.problems == [
        "the chat history has 0 rounds for 1 inputs: no reply read for this turn"
    ]
    assert turn.events == []


def test_history_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="history is for http agents"):
        AgentConfig.model_validate(
            {
                "protocol": "openai",
                "base_url": "http://x.test/v1",
                "history": {"url": "http://x.test/h"},
            }
        )
    with pytest.raises(ValueError, match="not a valid URL"):
        AgentConfig.model_validate(
            {
                "protocol": "http",
                "url": "http://x.test/",
                "history": {"url": "x.test/{{session_id}}"},
            }
        )


def test_an_embedded_run_stores_every_round_on_its_turn(
    agent: HistoryAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agenttest.yaml"
    config.write_text(json.dumps({"agents": {"travel": entry(agent, "end")}}), encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(booking_case()) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code = main(["-i", str(cases), "-n", "travel", "--config", str(config), "-o", str(out)])
    assert code == 0, capsys.readouterr()
    [record] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [t["events"] for t in record["turns"]] == ROUNDS
    assert record["turns"][0]["output"].endswith("Which one?")
    assert [a["passed"] for a in record["turns"][0]["assertions"]] == [True, True, True, True]
