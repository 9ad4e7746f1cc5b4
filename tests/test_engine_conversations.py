"""Conversation semantics through real HTTP: awaiting detection, the next input, limits,
tool mocks, attachments, metadata, agent errors, timeouts, statuses and durations.

The target is a scripted agent (tests/scripted_agent.py) or a bundled demo agent; the
engine plays each case turn by turn as a worker would, without Celery or a store.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import (
    Body,
    Reply,
    ScriptedAgent,
    call,
    demo_entry,
    fail,
    judge_verdict,
    project,
    run_case,
    say,
    simulator_turn,
)

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.cases.case_model import OnMissingInput
from agenttest_worker.cases.files import load_cases
from agenttest_worker.demo._protocol import metadata_of
from agenttest_worker.engine import MAX_TOOL_ROUNDS, NO_NEXT_TURN, RunOptions
from agenttest_worker.results import CaseResult

T002_QUESTION = "This requires manager approval. Please provide PO number."
T001_DONE = "Expense submitted. Reference: EXP-2025-001"


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        yield server


def config_for(agent: ScriptedAgent, demo_url: str | None = None, **target: Any) -> ProjectConfig:
    agents = {
        "target": agent.entry("target", **target),
        "sim": agent.entry("sim"),
        "judge": agent.entry("judge"),
    }
    if demo_url is not None:
        for model in ("expense", "user-sim", "validator", "echo"):
            agents[model] = demo_entry(demo_url, model)
        # The echo agent shows the body a target that asks for metadata gets.
        agents["echo"]["metadata"] = "object"
    return project(agents, defaults={"judge": "judge"})


def texts(agent: ScriptedAgent, model: str = "target") -> list[str]:
    """The last user message of every request `model` got."""
    out = []
    for body in agent.requests(model):
        users = [m for m in body["messages"] if m["role"] == "user"]
        content = users[-1]["content"] if users else ""
        out.append(content if isinstance(content, str) else content[0]["text"])
    return out


# -- awaiting detection ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "awaiting", "reason"),
    [
        pytest.param(say("Saved.", awaiting_input=True), True, "agent_declared", id="declared"),
        pytest.param(
            say("Shall I submit it?", awaiting_input=False),
            False,
            "agent_declared_complete",
            id="declared-false-beats-a-question",
        ),
        pytest.param(
            call("request_confirmation", {"summary": "$3500 travel"}),
            True,
            "tool_requires_confirmation",
            id="awaiting-tool",
        ),
        pytest.param(say(T002_QUESTION), True, "content_is_question", id="spec-T002"),
        pytest.param(say(T001_DONE), False, "completed", id="spec-T001-done"),
        pytest.param(
            say("Is this for travel? I filed it as travel for now."),
            True,
            "content_is_question",
            id="question-mark-mid-reply",
        ),
        pytest.param(
            say("**Is $3500 the right amount?** I can change it."),
            True,
            "content_is_question",
            id="question-in-markdown",
        ),
        pytest.param(
            say("Could you send the receipt. It helps."),
            True,
            "content_is_question",
            id="could-you",
        ),
        pytest.param(
            say("If you want me to proceed, reply YES."),
            True,
            "content_is_question",
            id="asks-to-proceed",
        ),
        pytest.param(
            say("I will reply to the vendor and continue."),
            False,
            "completed",
            id="statement-mentioning-continue",
        ),
        pytest.param(
            call("create_expense", {"amount": 3500}), False, "completed", id="tool-only-reply"
        ),
    ],
)
def test_awaiting_detection(
    agent: ScriptedAgent, reply: Reply, awaiting: bool, reason: str
) -> None:
    agent.script("target", [reply])
    result, _ = run_case(
        {"id": "W", "type": "multi_turn", "turns": [{"input": "go"}]}, config_for(agent)
    )
    first = result.turns[0]
    assert (first.awaiting_input, first.awaiting_reason) == (awaiting, reason)
    # Awaiting with nothing to answer: a JSONL case is skipped; otherwise it is complete.
    assert result.status == ("skipped" if awaiting else "passed")
    assert len(agent.requests("target")) == 1


def test_explicit_fields_are_recorded(agent: ScriptedAgent) -> None:
    agent.script("target", [say("Amount?", awaiting_input=True, input_hint="e.g. $3500")])
    result, _ = run_case(
        {"id": "H", "type": "multi_turn", "turns": [{"input": "go"}]}, config_for(agent)
    )
    assert result.turns[0].input_hint == "e.g. $3500"
    assert result.skip_reason == NO_NEXT_TURN


def test_configured_awaiting_tools_replace_the_defaults(agent: ScriptedAgent) -> None:
    agent.script("target", [call("needs_human"), call("request_confirmation")])
    options = RunOptions(target="target", awaiting_tools=["needs_human"])
    case = {"id": "AT", "type": "multi_turn", "turns": [{"input": "a"}, {"input": "b"}]}
    result, _ = run_case(case, config_for(agent), options)
    assert [t.awaiting_input for t in result.turns] == [True, False]
    assert result.status == "passed"


def test_a_mocked_awaiting_tool_was_answered_within_the_turn(agent: ScriptedAgent) -> None:
    # The mock confirms on the user's behalf, the agent then finishes: nothing awaits.
    agent.script("target", [call("request_confirmation"), say("Submitted.")])
    result, _ = run_case(
        {
            "id": "MC",
            "type": "multi_turn",
            "turns": [{"input": "submit"}],
            "tool_mocks": {"request_confirmation": {"confirmed": True}},
        },
        config_for(agent),
    )
    assert result.turns[0].awaiting_input is False
    assert result.status == "passed"


# -- the next input ----------------------------------------------------------------------


def test_static_turns_are_sent_even_when_the_agent_did_not_ask(agent: ScriptedAgent) -> None:
    agent.script("target", ["Hello! I can help you submit expense reports.", "Noted."])
    result, _ = run_case(
        {"id": "S", "turns": [{"input": "Hi"}, {"input": "Travel, $500"}]}, config_for(agent)
    )
    assert [t.awaiting_input for t in result.turns] == [False, False]
    assert texts(agent) == ["Hi", "Travel, $500"]
    second = agent.requests("target")[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == "Hello! I can help you submit expense reports."
    assert result.status == "passed" and result.total_turns == 2


def test_simulator_gives_the_next_input_after_static_turns(agent: ScriptedAgent) -> None:
    agent.script("target", ["What type of expense?", "Which date?", "Thanks, filed."])
    agent.script(
        "sim",
        [
            simulator_turn("Client dinner, $250", reasoning="answering the type"),
            simulator_turn("Yesterday"),
        ],
    )
    result, _ = run_case(
        {
            "id": "SIM",
            "turns": [{"input": "I want to file an expense"}],
            "simulator": {"use": "agents:sim", "metadata": {"goal": "file it"}},
        },
        config_for(agent),
    )
    assert [(t.input, t.input_source) for t in result.turns] == [
        ("I want to file an expense", "static"),
        ("Client dinner, $250", "simulator"),
        ("Yesterday", "simulator"),
    ]
    assert result.turns[1].simulator_reasoning == "answering the type"
    assert result.status == "passed" and result.goal_achieved is False
    assert result.simulator == "agents:sim"
    assert len(agent.requests("sim")) == 2  # not called once the agent stopped asking


def test_simulator_request_carries_history_and_spec_metadata(agent: ScriptedAgent) -> None:
    agent.script("target", ["What is the amount?", "Done."])
    agent.script("sim", [simulator_turn("$500")])
    run_case(
        {
            "id": "SM",
            "turns": [{"input": "Start expense report"}],
            "simulator": {
                "use": "agents:sim",
                "options": {"metadata": {"persona": "New employee", "max_turns": 6}},
                "metadata": {"goal": "Submit a $500 expense"},
            },
        },
        config_for(agent),
    )
    [request] = agent.requests("sim")
    metadata = metadata_of(request)
    assert metadata["test_mode"] == "simulator"
    assert metadata["test_id"] == "SM"
    assert metadata["persona"] == "New employee"
    assert metadata["goal"] == "Submit a $500 expense"
    assert metadata["turn_number"] == metadata["turn_count"] == 2
    assert metadata["last_response"] == "What is the amount?"
    assert metadata["max_turns"] == 6
    assert metadata["session_id"] == "session-SM"
    assert metadata["tool_results"] == {}
    system, *history = request["messages"]
    assert system["role"] == "system" and "New employee" in system["content"]
    assert history == [
        {
            "role": "user",
            "content": "Current conversation:\nUser: Start expense report\n\n"
            'Agent: What is the amount?\n\nThe agent just responded:\n"What is the amount?"',
        }
    ]


def test_demo_user_sim_drives_the_demo_expense_agent(agent: ScriptedAgent, demo_url: str) -> None:
    result, _ = run_case(
        {
            "id": "T003",
            "agent": "expense",
            "turns": [{"input": "Help me file an expense"}],
            "simulator": {"use": "agents:user-sim", "metadata": {"goal": "Submit the expense"}},
            "tool_mocks": {"create_expense": {"id": "EXP-9", "status": "draft"}},
            "final_assertions": [
                {"type": "json_path", "path": "$.expense.status", "value": "submitted"}
            ],
        },
        config_for(agent, demo_url),
    )
    assert [t.input for t in result.turns] == [
        "Help me file an expense",
        "It's for a client dinner, $250",
        "Yes, confirm",
    ]
    # The agent declared itself done after "Yes, confirm": the conversation is complete
    # without asking the simulator again.
    assert result.turns[-1].output == T001_DONE
    assert result.turns[-1].awaiting_reason == "agent_declared_complete"
    assert result.status == "passed", result.final_assertions


@pytest.mark.parametrize("policy", ["skip", "fail", "end"])
def test_on_missing_input(agent: ScriptedAgent, policy: str) -> None:
    agent.script("target", [say(T002_QUESTION)])
    result, _ = run_case(
        {
            "id": "T002",
            "turns": [{"input": "Submit $100,000 equipment purchase"}],
            "on_missing_input": policy,
            "final_assertions": [{"type": "contains", "value": "PO number"}],
        },
        config_for(agent),
    )
    assert result.total_turns == 1
    if policy == "skip":
        assert result.status == "skipped"
        assert result.skip_reason == "Agent awaiting input, no next turn defined"
        skipped = result.turns[1]
        assert (skipped.turn, skipped.input, skipped.status) == (2, None, "skipped")
        assert skipped.skip_reason == result.skip_reason
        assert result.final_assertions == []
    elif policy == "fail":
        assert result.status == "failed"
        assert result.error == (
            "Agent awaiting input, no next turn defined (on_missing_input: fail)"
        )
        assert len(result.turns) == 1
    else:
        assert result.status == "passed"
        assert len(result.turns) == 1
        assert [a.passed for a in result.final_assertions] == [True]


AWAITING_YAML = """\
tests:
  - name: approval
    rounds:
      - user_input: Submit $100,000 equipment purchase
    final_assertions:
      - {type: contains, value: PO number}
"""
AWAITING_JSONL = '{"id": "approval", "type": "multi_turn", "turns": [{"input": "Submit"}]}\n'


def test_yaml_cases_end_and_jsonl_cases_skip_by_default(
    agent: ScriptedAgent, tmp_path: Path
) -> None:
    (tmp_path / "a.yaml").write_text(AWAITING_YAML, encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(AWAITING_JSONL, encoding="utf-8")
    [yaml_case] = load_cases(tmp_path / "a.yaml")
    [jsonl_case] = load_cases(tmp_path / "b.jsonl")
    config = config_for(agent)

    def play(case: Any, override: OnMissingInput | None = None) -> CaseResult:
        agent.script("target", [say(T002_QUESTION)])
        options = RunOptions(target="target", on_missing_input=override)
        return run_case(case, config, options)[0]

    assert play(yaml_case).status == "passed"
    assert play(yaml_case).final_assertions[0].passed
    assert play(jsonl_case).status == "skipped"
    # --on-missing-input overrides both.
    assert play(yaml_case, "skip").status == "skipped"
    assert play(jsonl_case, "end").status == "passed"
    failed = play(jsonl_case, "fail")
    assert failed.status == "failed" and "on_missing_input: fail" in (failed.error or "")


ANYTHING_ELSE = "Hello! Your request is done. Is there anything else I can help with?"


def test_a_single_turn_case_ends_after_its_turn(agent: ScriptedAgent) -> None:
    """A case written in the single-turn form (`input`, or `type: single_turn`) is over
    after its turn: a reply that ends in a question does not leave it missing input."""
    agent.script("target", lambda body: say(ANYTHING_ELSE))
    q1 = {"id": "Q1", "input": "Hello", "assertions": [{"type": "contains", "value": "done"}]}
    result, _ = run_case(q1, config_for(agent))
    assert result.turns[0].awaiting_input is True  # still recorded as the agent asked
    assert (result.status, result.skip_reason, len(result.turns)) == ("passed", None, 1)
    # The same as its turns form, which the spec calls equivalent.
    turns_form = {"id": "Q1", "type": "single_turn", "turns": [{"input": "Hello"}]}
    assert run_case(turns_form, config_for(agent))[0].status == "passed"
    # An explicit on_missing_input still applies.
    assert run_case({**q1, "on_missing_input": "skip"}, config_for(agent))[0].status == "skipped"
    failed = run_case({**q1, "on_missing_input": "fail"}, config_for(agent))[0]
    assert failed.status == "failed" and "on_missing_input: fail" in (failed.error or "")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param({"input": "Submit $100,000", "type": "multi_turn"}, id="input-multi_turn"),
        pytest.param({"turns": [{"input": "Submit $100,000"}]}, id="turns"),
    ],
)
def test_the_spec_t002_as_a_multi_turn_case_is_skipped(
    agent: ScriptedAgent, case: dict[str, Any]
) -> None:
    """The spec's T002: an agent asking for a PO number in a multi-turn case, nothing
    to answer it: skipped, as the spec's console output shows."""
    agent.script("target", lambda body: say(T002_QUESTION))
    result, _ = run_case({"id": "T002", **case}, config_for(agent))
    assert result.turns[0].awaiting_input is True
    assert result.status == "skipped"
    assert result.skip_reason == NO_NEXT_TURN


def test_the_project_default_for_missing_input(agent: ScriptedAgent) -> None:
    """agenttest.yaml's `defaults.on_missing_input` replaces the default of every case
    that sets none; a case's own value beats it, and --on-missing-input beats both."""
    agent.script("target", lambda body: say(T002_QUESTION))
    agents = {"target": agent.entry("target")}
    skipping = project(agents, defaults={"on_missing_input": "skip"})
    single = {"id": "S", "input": "Submit $100,000"}
    multi = {"id": "M", "turns": [{"input": "Submit $100,000"}]}
    assert run_case(single, skipping)[0].status == "skipped"
    ending = project(agents, defaults={"on_missing_input": "end"})
    assert run_case(multi, ending)[0].status == "passed"
    assert run_case({**multi, "on_missing_input": "skip"}, ending)[0].status == "skipped"
    failing = RunOptions(target="target", on_missing_input="fail")
    overridden = run_case({**multi, "on_missing_input": "skip"}, ending, failing)[0]
    assert overridden.status == "failed"


def test_a_single_input_answered_without_a_question_passes(agent: ScriptedAgent) -> None:
    agent.script("target", [say("Hi there. I file expenses.")])
    result, _ = run_case(
        {"id": "ST", "input": "Hello", "assertions": [{"type": "contains", "value": "expense"}]},
        config_for(agent),
    )
    assert result.turns[0].awaiting_input is False
    assert result.status == "passed" and len(result.turns) == 1


BLANK = "no initial input: the first input is blank (empty or whitespace only)"


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ({"id": "EMPTY"}, "no initial input"),
        ({"id": "EMPTY", "input": ""}, BLANK),
        ({"id": "EMPTY", "input": "  \n\t "}, BLANK),
        ({"id": "EMPTY", "turns": [{"input": ""}]}, BLANK),
        ({"id": "EMPTY", "turns": [{"input": " "}, {"input": "then this"}]}, BLANK),
    ],
)
def test_a_case_without_input_fails_with_no_initial_input(
    agent: ScriptedAgent, case: dict[str, Any], error: str
) -> None:
    result, _ = run_case(case, config_for(agent))
    assert (result.status, result.error, result.total_turns) == ("failed", error, 0)
    assert agent.requests("target") == []


def test_a_later_empty_turn_is_sent_as_written(agent: ScriptedAgent) -> None:
    agent.script("target", ["First.", "Second."])
    result, _ = run_case({"id": "E2", "turns": [{"input": "hi"}, {"input": ""}]}, config_for(agent))
    assert result.status == "passed" and [t.input for t in result.turns] == ["hi", ""]


def test_interactive_input_then_nobody_answers(agent: ScriptedAgent) -> None:
    agent.script("target", [say(T002_QUESTION, input_hint="PO-12345"), "Which type?", "Thanks."])
    asked: list[tuple[str | None, str | None]] = []

    def person(state: Any) -> str | None:
        asked.append((state.prompt.question, state.prompt.hint))
        return "PO-777" if len(asked) == 1 else None

    case = {
        "id": "I",
        "turns": [{"input": "Submit $100,000"}],
        "interactive": {"enabled": True},
        "on_missing_input": "fail",
    }
    result, _ = run_case(case, config_for(agent), human=person)
    assert asked == [(T002_QUESTION, "PO-12345"), ("Which type?", None)]
    assert [(t.input, t.input_source) for t in result.turns] == [
        ("Submit $100,000", "static"),
        ("PO-777", "interactive"),
    ]
    assert result.status == "failed" and "on_missing_input: fail" in (result.error or "")
    # --skip-interactive (interactive=False) beats the case's `interactive.enabled`.
    agent.script("target", [say(T002_QUESTION)])
    result, _ = run_case(
        case, config_for(agent), RunOptions(target="target", interactive=False), human=person
    )
    assert len(asked) == 2 and result.status == "failed"


# -- limits ------------------------------------------------------------------------------


def always_asks(body: Body) -> Reply:
    return say("And then?")


def test_case_max_turns(agent: ScriptedAgent) -> None:
    agent.script("target", always_asks)
    agent.script("sim", lambda body: simulator_turn("more"))
    result, _ = run_case(
        {
            "id": "M",
            "turns": [{"input": "start"}],
            "max_turns": 3,
            "simulator": {"use": "agents:sim", "metadata": {"max_turns": 10}},
        },
        config_for(agent),
    )
    assert (result.status, result.error, result.total_turns) == (
        "failed",
        "max turns (3) exceeded",
        3,
    )
    assert len(agent.requests("target")) == 3
    assert metadata_of(agent.requests("sim")[-1])["max_turns"] == 3


def test_max_turns_below_the_static_turns_fails_the_case(agent: ScriptedAgent) -> None:
    """Not an error in the file: the case plays max_turns turns, then fails (DESIGN:
    needing a turn past the limit fails the case)."""
    agent.script("target", lambda body: say("Noted."))
    result, _ = run_case(
        {"id": "M4", "turns": [{"input": "a"}, {"input": "b"}, {"input": "c"}], "max_turns": 2},
        config_for(agent),
    )
    assert (result.status, result.error, result.total_turns) == (
        "failed",
        "max turns (2) exceeded",
        2,
    )
    assert len(agent.requests("target")) == 2


def test_simulator_max_turns(agent: ScriptedAgent) -> None:
    agent.script("target", always_asks)
    agent.script("sim", lambda body: simulator_turn("more"))
    result, _ = run_case(
        {
            "id": "M",
            "turns": [{"input": "start"}],
            "simulator": {"use": "agents:sim", "options": {"metadata": {"max_turns": 2}}},
        },
        config_for(agent),
    )
    assert (result.error, result.total_turns) == ("max turns (2) exceeded", 2)


def test_default_max_turns_is_20(agent: ScriptedAgent) -> None:
    agent.script("target", always_asks)
    agent.script("sim", lambda body: simulator_turn("more"))
    result, _ = run_case(
        {"id": "M", "turns": [{"input": "start"}], "simulator": {"use": "agents:sim"}},
        config_for(agent),
    )
    assert (result.status, result.error, result.total_turns) == (
        "failed",
        "max turns (20) exceeded",
        20,
    )
    assert metadata_of(agent.requests("sim")[0])["max_turns"] == 20


def test_goal_achieved_ends_without_sending_its_input(agent: ScriptedAgent) -> None:
    agent.script("target", [say("What amount?"), say("Filed. Anything else?")])
    agent.script(
        "sim",
        [simulator_turn("$500"), simulator_turn("bye", goal_achieved=True, reasoning="filed")],
    )
    result, _ = run_case(
        {
            "id": "G",
            "turns": [{"input": "file"}],
            "simulator": {"use": "agents:sim"},
            "final_assertions": [{"type": "contains", "value": "Filed"}],
        },
        config_for(agent),
    )
    assert texts(agent) == ["file", "$500"]
    assert result.goal_achieved is True and result.status == "passed"
    assert result.total_turns == 2 and len(result.turns) == 2
    assert result.turns[-1].simulator_reasoning == "filed"
    assert result.final_assertions[0].passed


def test_simulator_junk_skips_the_turn(agent: ScriptedAgent, demo_url: str) -> None:
    result, _ = run_case(
        {
            "id": "J",
            "agent": "expense",
            "turns": [{"input": "I want to submit an expense"}],
            "simulator": {"use": "agents:user-sim", "metadata": {"junk": True}},
        },
        config_for(agent, demo_url),
    )
    assert result.status == "skipped"
    assert result.skip_reason is not None
    assert result.skip_reason.startswith(
        'simulator error: simulator user-sim: reply is not JSON: "I am not sure what to say"'
    )
    skipped = result.turns[1]
    assert (skipped.input, skipped.status, skipped.input_source) == (None, "skipped", "simulator")
    assert skipped.skip_reason == result.skip_reason
    assert result.total_turns == 1


def test_a_role_reply_that_does_not_parse_is_kept_on_its_call(agent: ScriptedAgent) -> None:
    """DESIGN: a role reply that does not parse is an error "with the raw text kept": the
    whole reply (up to 4,096 characters), not the snippet in the reason."""
    rambling = "Well, let me think. " * 100  # 2,000 characters, no JSON
    agent.script("target", [say("What amount?"), say("Fine.")])
    agent.script("sim", [Reply(content=rambling)])
    agent.script("judge", [Reply(content=rambling)])
    result, _ = run_case(
        {
            "id": "K",
            "turns": [{"input": "file", "assertions": [{"type": "agent", "use": "agents:judge"}]}],
            "simulator": {"use": "agents:sim"},
        },
        config_for(agent),
    )
    first, skipped = result.turns
    [judge_call] = [c for c in first.calls or [] if c.role == "validator"]
    assert judge_call.reply == rambling and judge_call.error is not None
    assert not first.assertions[0].passed and "reply is not JSON" in first.assertions[0].reason
    [sim_call] = [c for c in skipped.calls or [] if c.role == "simulator"]
    assert sim_call.reply == rambling
    assert sim_call.error is not None and sim_call.error.startswith("simulator sim: ")
    assert len(skipped.skip_reason or "") < len(rambling), "the reason keeps a snippet"


# -- tool mocks --------------------------------------------------------------------------


def test_mocked_tool_result_goes_back_within_the_turn(agent: ScriptedAgent) -> None:
    agent.script(
        "target",
        [call("create_expense", {"amount": 3500}), say("Created EXP-1.")],
    )
    result, _ = run_case(
        {
            "id": "TM",
            "input": "File $3500",
            "tool_mocks": {"create_expense": {"id": "EXP-1", "status": "draft"}},
            "final_assertions": [
                {"type": "json_path", "path": "$.tool_results.create_expense.id", "value": "EXP-1"}
            ],
        },
        config_for(agent),
    )
    [turn] = result.turns
    assert turn.output == "Created EXP-1."
    assert [(c.name, c.args) for c in turn.tool_calls] == [("create_expense", {"amount": 3500})]
    assert turn.tool_results == {"create_expense": {"id": "EXP-1", "status": "draft"}}
    assert result.final_assertions[0].passed
    first, second = agent.requests("target")
    assert len(first["messages"]) == 1
    assistant, tool = second["messages"][1:]
    call_id = assistant["tool_calls"][0]["id"]
    assert tool == {
        "role": "tool",
        "tool_call_id": call_id,
        "content": json.dumps({"id": "EXP-1", "status": "draft"}),
    }
    assert [c.role for c in turn.calls or []] == ["target", "target"]
    assert result.total_turns == 1


def test_turn_mocks_override_case_mocks(agent: ScriptedAgent) -> None:
    agent.script("target", [call("lookup"), "one", call("lookup"), "two"])
    result, _ = run_case(
        {
            "id": "TO",
            "turns": [
                {"input": "a"},
                {"input": "b", "tool_mocks": {"lookup": "turn value"}},
            ],
            "tool_mocks": {"lookup": "case value"},
        },
        config_for(agent),
    )
    assert [t.tool_results for t in result.turns] == [
        {"lookup": "case value"},
        {"lookup": "turn value"},
    ]
    tool_messages = [m for m in agent.requests("target")[3]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["case value", "turn value"]


def test_unmocked_tool_call_is_answered_not_executed(agent: ScriptedAgent) -> None:
    agent.script("target", [call("create_expense", {"amount": 5}), "OK."])
    result, _ = run_case(
        {"id": "U", "turns": [{"input": "file $5"}, {"input": "thanks"}]}, config_for(agent)
    )
    assert len(agent.requests("target")) == 2  # no second call within turn 1
    assert result.turns[0].tool_results is None
    assistant, tool = agent.requests("target")[1]["messages"][1:3]
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert json.loads(tool["content"]) == {
        "status": "not executed",
        "reason": "no tool_mocks entry for create_expense in the test case",
    }


def test_tool_calls_without_ids_get_matching_ids(agent: ScriptedAgent) -> None:
    raw = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    agent.script("target", [Reply(raw=raw), "done"])
    run_case({"id": "NI", "input": "x", "tool_mocks": {"f": 1}}, config_for(agent))
    assistant, tool = agent.requests("target")[1]["messages"][1:]
    assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"]


def test_a_target_that_keeps_calling_mocked_tools_is_stopped(agent: ScriptedAgent) -> None:
    agent.script("target", lambda body: call("lookup", {"n": len(body["messages"])}))
    result, _ = run_case(
        {
            "id": "L",
            "turns": [{"input": "go"}, {"input": "never sent"}],
            "tool_mocks": {"lookup": 1},
        },
        config_for(agent),
    )
    assert len(agent.requests("target")) == MAX_TOOL_ROUNDS
    [turn] = result.turns
    assert turn.error == (
        f"agent error: the agent kept calling tools after {MAX_TOOL_ROUNDS} mocked results"
    )
    assert result.status == "failed" and result.total_turns == 1
    assert result.error == f"turn 1: {turn.error}"
    # What the agent did before the error stays on the turn (DESIGN: tool calls are
    # recorded on the turn, mocked results under tool_results).
    assert [c.args for c in turn.tool_calls] == [{"n": 1 + 2 * i} for i in range(MAX_TOOL_ROUNDS)]
    assert turn.tool_results == {"lookup": 1}


def test_a_tool_call_before_a_failed_call_is_recorded(agent: ScriptedAgent) -> None:
    agent.script("target", [call("create_expense", {"amount": 5}), fail(400, "bad request")])
    result, _ = run_case(
        {"id": "F", "input": "file it", "tool_mocks": {"create_expense": {"id": "E1"}}},
        config_for(agent),
    )
    [turn] = result.turns
    assert turn.error is not None and turn.status == "failed"
    assert [(c.name, c.args) for c in turn.tool_calls] == [("create_expense", {"amount": 5})]
    assert turn.tool_results == {"create_expense": {"id": "E1"}}


def test_a_turn_judge_sees_a_reply_that_only_calls_tools(agent: ScriptedAgent) -> None:
    """The validator gets [user: input, assistant: response]: a response that is only a
    tool call reaches it as the call (and the result given), not as an empty message."""
    agent.script("target", [call("create_expense", {"amount": 3500})])
    agent.script("judge", [judge_verdict(True, "called it")])
    judged = {"type": "agent", "use": "agents:judge", "options": {"metadata": {"criteria": "c"}}}
    result, _ = run_case(
        {"id": "J", "input": "Business travel, $3500", "assertions": [judged]},
        config_for(agent),
    )
    assert result.turns[0].assertions[0].passed
    [request] = agent.requests("judge")
    user, assistant = request["messages"][1:]
    assert user == {"role": "user", "content": "Business travel, $3500"}
    assert assistant["role"] == "assistant"
    assert assistant["content"].startswith('[tool calls: create_expense({"amount": 3500})]')
    assert "[tool result create_expense: " in assistant["content"]


def test_a_turn_judge_sees_a_text_reply_as_it_is(agent: ScriptedAgent) -> None:
    agent.script("target", [say("Your expense is filed.")])
    agent.script("judge", [judge_verdict(True)])
    judged = {"type": "agent", "use": "agents:judge"}
    run_case({"id": "J", "input": "File it", "assertions": [judged]}, config_for(agent))
    [request] = agent.requests("judge")
    assert request["messages"][1:] == [
        {"role": "user", "content": "File it"},
        {"role": "assistant", "content": "Your expense is filed."},
    ]


def test_spec_t001_with_the_demo_expense_agent(agent: ScriptedAgent, demo_url: str) -> None:
    result, _ = run_case(
        {
            "id": "T001",
            "agent": "expense",
            "turns": [
                {
                    "input": "I want to submit an expense",
                    "assertions": [{"type": "contains", "value": "type of expense"}],
                },
                {
                    "input": "Business travel, $3500",
                    "assertions": [
                        {"type": "tool_called", "name": "create_expense", "args": {"amount": 3500}}
                    ],
                },
                {
                    "input": "Yes, confirm",
                    "assertions": [{"type": "contains", "value": "submitted"}],
                },
            ],
            "tool_mocks": {"create_expense": {"id": "EXP-1", "status": "draft"}},
            "final_assertions": [
                {"type": "json_path", "path": "$.expense.status", "value": "submitted"}
            ],
        },
        config_for(agent, demo_url),
    )
    assert result.status == "passed", result.model_dump()
    assert [t.awaiting_input for t in result.turns] == [True, True, False]
    assert (result.turns[1].output or "").startswith("I've prepared expense EXP-1 for $3500")
    assert result.turns[2].output == T001_DONE


# -- attachments and metadata ------------------------------------------------------------

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
PDF = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4 fake").decode()


def test_attachments_travel_as_content_parts(agent: ScriptedAgent, demo_url: str) -> None:
    agent.script("target", ["Got them."])
    run_case(
        {
            "id": "ATT",
            "input": "Here are my receipts",
            "attachments": [
                {"type": "image", "source": PNG},
                {"type": "file", "source": PDF, "name": "receipt.pdf"},
            ],
        },
        config_for(agent),
    )
    [message] = agent.requests("target")[0]["messages"]
    assert message == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Here are my receipts"},
            {"type": "image_url", "image_url": {"url": PNG}},
            {"type": "file", "file": {"filename": "receipt.pdf", "file_data": PDF}},
        ],
    }
    # The demo expense agent reads the image it was sent.
    result, _ = run_case(
        {
            "id": "ATT2",
            "agent": "expense",
            "input": "My receipt",
            # The agent asks what the expense is for; nobody answers here.
            "on_missing_input": "end",
            "attachments": [{"type": "image", "source": PNG}],
            "assertions": [{"type": "contains", "value": "receipt image (12 bytes)"}],
        },
        config_for(agent, demo_url),
    )
    assert result.status == "passed", result.turns[0].assertions


def test_metadata_is_merged_case_then_turn(agent: ScriptedAgent, demo_url: str) -> None:
    agent.script("target", ["one", "two"])
    run_case(
        {
            "id": "MD",
            "options": {"metadata": {"scenario": "edge-case", "locale": "en"}},
            "turns": [
                {"input": "a", "options": {"metadata": {"locale": "fr", "step": 1}}},
                {"input": "b"},
            ],
        },
        config_for(agent, metadata="object"),
    )
    first, second = agent.requests("target")
    assert first["metadata"] == {"scenario": "edge-case", "locale": "fr", "step": 1}
    assert second["metadata"] == {"scenario": "edge-case", "locale": "en"}
    # The demo echo agent shows the same body from the other side.
    result, _ = run_case(
        {
            "id": "MD2",
            "agent": "echo",
            "options": {"metadata": {"scenario": "edge-case"}},
            "input": "hi",
            "assertions": [
                {"type": "json_path", "path": "$.metadata.scenario", "value": "edge-case"}
            ],
        },
        config_for(agent, demo_url),
    )
    assert result.status == "passed"


# -- errors, timeouts, statuses, durations -----------------------------------------------


def test_http_500_after_retries_fails_the_turn_and_ends_the_conversation(
    agent: ScriptedAgent,
) -> None:
    agent.script("target", lambda body: fail(500, "model crashed", headers={"Retry-After": "0"}))
    result, _ = run_case(
        {"id": "E", "turns": [{"input": "one"}, {"input": "two"}]}, config_for(agent)
    )
    [turn] = result.turns
    assert turn.error is not None
    assert turn.error.startswith("agent error: HTTP 500 from target: ")
    assert "model crashed" in turn.error and turn.error.endswith("(after 2 attempts)")
    assert turn.status == "failed" and turn.output is None
    assert [(c.attempts, c.status_code) for c in turn.calls or []] == [(2, 500)]
    assert len(agent.requests("target")) == 2  # one retry, then no turn 2
    assert result.status == "failed" and result.error == f"turn 1: {turn.error}"


def test_a_4xx_is_not_retried(agent: ScriptedAgent) -> None:
    agent.script("target", lambda body: fail(400, "bad model name"))
    result, _ = run_case({"id": "E4", "input": "x"}, config_for(agent))
    assert len(agent.requests("target")) == 1
    assert result.turns[0].error is not None
    assert result.turns[0].error.startswith("agent error: HTTP 400 from target")


def test_agent_timeout_fails_the_turn(agent: ScriptedAgent) -> None:
    agent.script("target", [say("late", delay=1.0)])
    result, _ = run_case(
        {"id": "TO", "turns": [{"input": "one"}, {"input": "two"}]},
        config_for(agent, timeout=0.15, max_retries=0),
    )
    [turn] = result.turns
    assert turn.error == "timeout after 0.15s"
    assert result.status == "failed" and result.total_turns == 1


def test_a_failed_assertion_does_not_end_the_conversation(agent: ScriptedAgent) -> None:
    agent.script("target", ["Hello", "Bye"])
    result, _ = run_case(
        {
            "id": "FA",
            "turns": [
                {"input": "hi", "assertions": [{"type": "contains", "value": "Welcome"}]},
                {"input": "bye", "assertions": [{"type": "contains", "value": "Bye"}]},
            ],
        },
        config_for(agent),
    )
    assert [t.status for t in result.turns] == ["failed", "passed"]
    assert result.status == "failed" and result.error is None and result.total_turns == 2


def test_case_timeout(agent: ScriptedAgent) -> None:
    agent.script("target", lambda body: say("slow", delay=0.3))
    result, _ = run_case(
        {"id": "CT", "turns": [{"input": "a"}, {"input": "b"}, {"input": "c"}]},
        config_for(agent),
        RunOptions(target="target", case_timeout=0.5),
    )
    assert [t.error for t in result.turns] == [
        None,
        "timeout after 500ms (the case's time limit)",
    ]
    assert result.status == "failed" and result.total_turns == 2


def test_failed_beats_skipped_beats_passed(agent: ScriptedAgent) -> None:
    case = {
        "id": "ST",
        "type": "multi_turn",
        "turns": [{"input": "x", "assertions": [{"type": "contains", "value": "Amount"}]}],
    }
    agent.script("target", [say("Which amount?")])
    failed, _ = run_case(case, config_for(agent))
    assert failed.status == "failed" and failed.skip_reason == NO_NEXT_TURN
    agent.script("target", [say("Amount?")])
    skipped, _ = run_case(case, config_for(agent))
    assert skipped.status == "skipped"
    agent.script("target", [say("Amount recorded.")])
    passed, _ = run_case(case, config_for(agent))
    assert passed.status == "passed" and passed.skip_reason is None
    # Skipped turns are not sent turns.
    assert (skipped.total_turns, len(skipped.turns)) == (1, 2)


def test_durations_add_up(agent: ScriptedAgent) -> None:
    agent.script("target", [say("What amount?", delay=0.1), say("Filed.", delay=0.05)])
    agent.script("sim", [Reply(content=json.dumps({"input": "$5"}), delay=0.15)])
    result, _ = run_case(
        {"id": "D", "turns": [{"input": "file"}], "simulator": {"use": "agents:sim"}},
        config_for(agent),
    )
    first, second = result.turns
    assert first.duration_ms >= 100
    # The simulator call that wrote turn 2's input is counted (and recorded) in turn 2.
    assert second.duration_ms >= 150 + 50
    assert [c.role for c in first.calls or []] == ["target"]
    assert [c.role for c in second.calls or []] == ["simulator", "target"]
    assert result.duration_ms == first.duration_ms + second.duration_ms
    assert second.usage is not None and second.usage.total_tokens == 30


def test_goal_achieved_call_counts_in_the_last_turn(agent: ScriptedAgent) -> None:
    agent.script("target", [say("Done. Anything else?")])
    agent.script("sim", [Reply(content='{"goal_achieved": true}', delay=0.1)])
    result, _ = run_case(
        {"id": "D2", "turns": [{"input": "file"}], "simulator": {"use": "agents:sim"}},
        config_for(agent),
    )
    [turn] = result.turns
    assert turn.duration_ms >= 100
    assert [c.role for c in turn.calls or []] == ["target", "simulator"]
    assert turn.usage is not None and turn.usage.total_tokens == 30
    assert result.duration_ms == turn.duration_ms


def test_connector_sends_the_turn_to_another_registry_agent(agent: ScriptedAgent) -> None:
    agent.script("target", lambda body: say("from target"))
    agent.script("alt", lambda body: say("from alt"))
    agent.script("cli", lambda body: say("from cli"))
    config = project(
        {name: agent.entry(name) for name in ("target", "alt", "cli")},
    )
    case = {
        "id": "C",
        "options": {"connector": "not-in-registry"},  # ignored: not a registry agent
        "turns": [{"input": "a"}, {"input": "b", "options": {"connector": "alt"}}],
    }
    result, _ = run_case(case, config)
    assert [t.output for t in result.turns] == ["from target", "from alt"]
    # -c beats the turn's connector.
    result, _ = run_case(case, config, RunOptions(target="target", connector="cli"))
    assert [t.output for t in result.turns] == ["from cli", "from cli"]
