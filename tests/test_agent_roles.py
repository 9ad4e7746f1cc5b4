"""Role calls (simulator, validator, generator) as the spec describes them, over real HTTP.

Request shapes are checked on a scripted server that records them and against the demo
agents (their "echo" model returns what it received); behaviour against the demo
simulator, validator and generator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from agent_servers import AgentServer, Reply, completion, run, tool_call

from agenttest_worker.agents.config import AgentConfig, Defaults, ProjectConfig
from agenttest_worker.agents.interface import AgentError, AgentRequest
from agenttest_worker.agents.options import Options
from agenttest_worker.agents.pool import AgentPool, RoleSession
from agenttest_worker.agents.roles import (
    SIMULATOR_CONVERSATION,
    SIMULATOR_PROMPT,
    ReplyParseError,
    conversation_for_role,
    parse_json_reply,
    read_generator_reply,
    read_simulator_reply,
    read_validator_reply,
    simulator_request,
)
from agenttest_worker.demo._protocol import metadata_of
from agenttest_worker.results import AgentCallRecord

CHAT = "/v1/chat/completions"
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are the expense assistant."},
    {"role": "user", "content": "I want to submit an expense"},
    {"role": "assistant", "content": "What type of expense would you like to submit?"},
    {"role": "user", "content": [{"type": "text", "text": "Business travel, $3500"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("create_expense", {"amount": 3500}, "call_1")],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"id": "EXP-1", "status": "draft"}'},
    {"role": "assistant", "content": "This requires manager approval. Please provide PO number."},
]
# What a simulator or judge reads of CONVERSATION: user/assistant turns as they are, the
# system prompt left out, tool plumbing folded into the assistant's text.
FOLDED: list[dict[str, Any]] = [
    {"role": "user", "content": "I want to submit an expense"},
    {"role": "assistant", "content": "What type of expense would you like to submit?"},
    {"role": "user", "content": "Business travel, $3500"},
    {
        "role": "assistant",
        "content": '[tool calls: create_expense({"amount": 3500})]\n'
        '[tool result create_expense: {"id": "EXP-1", "status": "draft"}]',
    },
    {"role": "assistant", "content": "This requires manager approval. Please provide PO number."},
]
LAST = "This requires manager approval. Please provide PO number."
# CONVERSATION as the simulator's one user message (`messages: transcript`, the default).
TRANSCRIPT = (
    "Current conversation:\n"
    "User: I want to submit an expense\n\n"
    "Agent: What type of expense would you like to submit?\n\n"
    "User: Business travel, $3500\n\n"
    'Agent: [tool calls: create_expense({"amount": 3500})]\n'
    '[tool result create_expense: {"id": "EXP-1", "status": "draft"}]\n\n'
    f"Agent: {LAST}\n\n"
    f'The agent just responded:\n"{LAST}"'
)
SWAPPED = [{**m, "role": "user" if m["role"] == "assistant" else "assistant"} for m in FOLDED]
SIM_METADATA: dict[str, Any] = {
    "test_mode": "simulator",
    "persona": "a busy sales manager",
    "goal": "Submit the travel expense",
    "turn_number": 3,
    "max_turns": 8,
}


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as running:
        yield running


def openai(base_url: str, model: str, **fields: Any) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "protocol": "openai",
            "base_url": base_url,
            "model": model,
            "timeout": 5,
            "base_delay": 0.01,
            **fields,
        }
    )


def demo_session(demo_url: str, log: list[AgentCallRecord], **fields: Any) -> RoleSession:
    agents = {
        "workers.test.user-sim": openai(demo_url, "user-sim", **fields),
        "workers.test.validator": openai(demo_url, "validator", **fields),
        "workers.test.generator": openai(demo_url, "generator", **fields),
        # Asks for the metadata in the body: the echo shows the whole role request.
        "workers.test.echo": openai(demo_url, "echo", **{"metadata": "object", **fields}),
    }
    config = ProjectConfig(agents=agents, defaults=Defaults(judge="workers.test.validator"))
    return AgentPool(config).session(log)


def scripted_session(server: AgentServer, log: list[AgentCallRecord], **fields: Any) -> RoleSession:
    config = ProjectConfig(
        agents={"helper": openai(server.url("/v1"), "helper", **fields)},
        defaults=Defaults(judge="helper"),
    )
    return AgentPool(config).session(log)


def simulate(session: RoleSession, use: str, metadata: dict[str, Any], history: Any = None) -> Any:
    return run(
        session.simulate(
            use,
            CONVERSATION if history is None else history,
            metadata,
            session_id="sess-9",
            case_id="T002",
            turn=3,
        )
    )


# -- lenient parsing ---------------------------------------------------------------------------


def test_parse_plain_json() -> None:
    assert parse_json_reply('  {"passed": true, "reason": "ok"}\n') == {
        "passed": True,
        "reason": "ok",
    }


def test_parse_fenced_json_after_prose() -> None:
    text = 'Here is my evaluation:\n```json\n{"passed": false, "score": 0.5}\n```\nThanks.'
    assert parse_json_reply(text) == {"passed": False, "score": 0.5}


def test_a_fenced_block_wins_over_json_quoted_in_the_prose() -> None:
    text = (
        'You asked for {"passed": true, "reason": "..."}. My verdict:\n'
        '```json\n{"passed": false, "reason": "missing total"}\n```'
    )
    assert parse_json_reply(text) == {"passed": False, "reason": "missing total"}


def test_parse_the_first_fenced_block_that_is_json() -> None:
    text = '```\nnot json {\n```\nthen\n```JSON\n{"input": "hi"}\n```'
    assert parse_json_reply(text) == {"input": "hi"}


def test_parse_json_embedded_in_prose() -> None:
    text = 'Sure! My answer is {"input": "PO-12345", "goal_achieved": false} - hope it helps {'
    assert parse_json_reply(text) == {"input": "PO-12345", "goal_achieved": False}


@pytest.mark.parametrize("junk", ["I am not sure what to say", "", None, "[1, 2]", "{broken"])
def test_junk_is_a_parse_error_keeping_the_raw_text(junk: str | None) -> None:
    with pytest.raises(ReplyParseError) as caught:
        parse_json_reply(junk)
    assert caught.value.raw == (junk or "")
    assert "reply is not JSON" in str(caught.value)


def test_read_simulator_reply() -> None:
    turn = read_simulator_reply('{"input": "PO-1", "goal_achieved": false, "reasoning": "r"}')
    assert (turn.input, turn.goal_achieved, turn.reasoning) == ("PO-1", False, "r")
    done = read_simulator_reply('{"goal_achieved": "true"}')
    assert (done.input, done.goal_achieved) == ("", True)
    assert read_simulator_reply('{"input": 12345}').input == "12345"
    for bad in ['{"reasoning": "no input"}', '{"input": "  ", "goal_achieved": false}']:
        with pytest.raises(ReplyParseError) as caught:
            read_simulator_reply(bad)
        assert caught.value.raw == bad


@pytest.mark.parametrize(
    ("reply", "passed"),
    [
        ('{"passed": true, "reason": "ok"}', True),
        ('{"passed": false, "reason": "no"}', False),
        ('{"pass": true, "reason": "tdx style"}', True),
        ('{"pass": false, "reasoning": "tdx style"}', False),
        ('{"result": "fail", "reason": "r"}', False),
        ('{"result": "PASS", "reason": "r"}', True),
        ('{"passed": "false"}', False),
    ],
)
def test_read_validator_reply_verdicts(reply: str, passed: bool) -> None:
    assert read_validator_reply(reply).passed is passed


def test_read_validator_reply_fields() -> None:
    verdict = read_validator_reply(
        '```json\n{"passed": true, "score": 1, "reason": "all good", "suggestions": ["x", 2]}\n```'
    )
    assert verdict.reason == "all good"
    assert verdict.score == 1.0
    assert verdict.suggestions == ["x", "2"]
    bare = read_validator_reply('{"pass": false, "reasoning": "why not", "score": "high"}')
    assert (bare.reason, bare.score, bare.suggestions) == ("why not", None, None)
    assert read_validator_reply('{"passed": true, "score": " 0.7"}').score == 0.7
    assert read_validator_reply('{"passed": true, "score": "nan"}').score is None


@pytest.mark.parametrize("reply", ['{"score": 1, "reason": "?"}', '{"result": "maybe"}'])
def test_a_reply_without_a_verdict_is_a_parse_error(reply: str) -> None:
    with pytest.raises(ReplyParseError, match="no `passed` verdict") as caught:
        read_validator_reply(reply)
    assert caught.value.raw == reply


def test_read_generator_reply() -> None:
    assert read_generator_reply('[{"id": "A"}]') == [{"id": "A"}]
    assert read_generator_reply('Cases:\n```json\n{"cases": [{"id": "B"}]}\n```') == [{"id": "B"}]
    with pytest.raises(ReplyParseError, match="no `cases` list"):
        read_generator_reply('{"tests": []}')


def test_read_generator_reply_takes_an_array_in_a_fence_or_in_prose() -> None:
    """The spec's generator prompt asks for a JSON array; models often fence it."""
    fenced = 'Here you go:\n```json\n[{"id": "A", "input": "hi"}, {"id": "B"}]\n```'
    assert read_generator_reply(fenced) == [{"id": "A", "input": "hi"}, {"id": "B"}]
    prose = 'I made [2] cases: [{"id": "C"}, {"id": "D"}] as asked.'
    assert read_generator_reply(prose) == [{"id": "C"}, {"id": "D"}]
    with pytest.raises(ReplyParseError, match="no `cases` list"):
        read_generator_reply("I made [2] cases, sorry, no JSON.")


def test_conversation_for_role_folds_tool_plumbing() -> None:
    assert conversation_for_role(CONVERSATION) == FOLDED


# -- simulator ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "conversation"),
    [
        ("transcript", [{"role": "user", "content": TRANSCRIPT}]),
        ("as_is", FOLDED),
        ("swapped", SWAPPED),
    ],
)
def test_simulator_request_shape_on_the_wire(
    server: AgentServer, mode: str, conversation: list[dict[str, Any]]
) -> None:
    server.script(
        CHAT,
        Reply(body=completion('{"input": "PO-12345", "goal_achieved": false, "reasoning": "r"}')),
    )
    log: list[AgentCallRecord] = []
    session = scripted_session(server, log, messages=mode)
    turn = simulate(session, "agents:helper", SIM_METADATA)
    assert (turn.input, turn.goal_achieved, turn.reasoning) == ("PO-12345", False, "r")
    [body] = server.bodies(CHAT)
    # No tools for a simulator, and no `metadata` field for an openai agent that does not
    # ask for it: the prompt carries it, with the turn count and the last response.
    assert set(body) == {"model", "messages"}
    metadata = metadata_of(body)
    assert metadata == {**SIM_METADATA, "turn_count": 3, "last_response": LAST}
    system, *history = body["messages"]
    assert history == conversation
    assert system["role"] == "system"
    assert system["content"] == SIMULATOR_PROMPT.format(
        persona="a busy sales manager",
        goal="Submit the travel expense",
        turn_number=3,
        max_turns=8,
        conversation=SIMULATOR_CONVERSATION[mode].format(last_response=LAST),
        metadata=json.dumps(metadata),
    )
    if mode != "transcript":
        assert f'The agent just responded:\n"{LAST}"' in system["content"]
    assert [(r.role, r.agent, r.status_code) for r in log] == [("simulator", "helper", 200)]


def test_simulator_metadata_gets_test_mode_turn_and_last_response(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion('{"input": "hi"}')))
    simulate(scripted_session(server, []), "helper", {"persona": "p"})
    assert metadata_of(server.bodies(CHAT)[0]) == {
        "test_mode": "simulator",
        "turn_number": 3,
        "turn_count": 3,
        "last_response": LAST,
        "persona": "p",
    }


def test_simulator_request_seen_by_the_demo_echo_agent(demo_url: str) -> None:
    request = simulator_request(CONVERSATION, SIM_METADATA, "sess-9", "T002", 3)
    log: list[AgentCallRecord] = []
    reply = run(demo_session(demo_url, log).call("workers.test.echo", request))
    echoed = json.loads(reply.content or "")
    assert echoed["metadata"] == SIM_METADATA
    assert echoed["tools"] is None
    assert echoed["messages"][0]["role"] == "system"
    assert "Persona: a busy sales manager" in echoed["messages"][0]["content"]
    assert "Goal: Submit the travel expense" in echoed["messages"][0]["content"]
    assert "Turn: 3 of at most 8" in echoed["messages"][0]["content"]
    assert echoed["messages"][1:] == [{"role": "user", "content": TRANSCRIPT}]
    assert log and log[0].usage is not None and log[0].usage.total_tokens > 0


def test_demo_simulator_answers_the_last_question(demo_url: str) -> None:
    log: list[AgentCallRecord] = []
    session = demo_session(demo_url, log)
    turn = simulate(session, "agents:workers.test.user-sim", SIM_METADATA)
    assert (turn.input, turn.goal_achieved) == ("PO-12345", False)
    assert turn.reasoning == "The agent asked for a PO number."
    done = simulate(
        session,
        "workers.test.user-sim",
        SIM_METADATA,
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Expense submitted."}],
    )
    assert (done.input, done.goal_achieved) == ("", True)
    assert [r.role for r in log] == ["simulator", "simulator"]
    assert all(r.error is None and r.attempts == 1 for r in log)


@pytest.mark.parametrize("mode", ["object", "strings"])
def test_demo_simulator_junk_is_a_parse_error_keeping_the_raw_text(
    demo_url: str, mode: str
) -> None:
    log: list[AgentCallRecord] = []
    session = demo_session(demo_url, log, metadata=mode)
    with pytest.raises(AgentError) as caught:
        simulate(session, "agents:workers.test.user-sim", {**SIM_METADATA, "junk": True})
    error = caught.value
    assert error.kind == "parse"
    assert error.raw == "I am not sure what to say"
    assert error.message == (
        'simulator workers.test.user-sim: reply is not JSON: "I am not sure what to say"'
    )
    # The call went through and is on the log, marked with what went wrong.
    assert error.call is not None and error.call.status_code == 200
    assert log == [error.call]
    assert log[0].error == error.message


def test_unknown_simulator_is_a_config_error(demo_url: str) -> None:
    with pytest.raises(AgentError) as caught:
        simulate(demo_session(demo_url, []), "agents:workers.test.user-sym", SIM_METADATA)
    assert caught.value.kind == "config"
    assert "did you mean 'workers.test.user-sim'" in caught.value.message


def test_simulator_http_failure_is_logged(server: AgentServer) -> None:
    server.always(CHAT, Reply(401, body={"error": {"message": "bad key"}}))
    log: list[AgentCallRecord] = []
    with pytest.raises(AgentError) as caught:
        simulate(scripted_session(server, log), "helper", SIM_METADATA)
    assert caught.value.kind == "http"
    assert [(r.status_code, r.error) for r in log] == [(401, caught.value.message)]


# -- validator -----------------------------------------------------------------------------------


def judge(session: RoleSession, messages: list[dict[str, Any]], criteria: str, **kw: Any) -> Any:
    options = Options(connector=kw.get("connector"), params=kw.get("params") or {})
    return run(session.judge(kw.get("use"), messages, {"criteria": criteria}, options))


def test_validator_request_shape_on_the_wire(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion('{"passed": true, "score": 0.9, "reason": "ok"}')))
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! I can help with expense reports."},
    ]
    outcome = judge(scripted_session(server, []), messages, 'Mentions "expense"')
    assert (outcome.passed, outcome.score, outcome.reason) == (True, 0.9, "ok")
    [body] = server.bodies(CHAT)
    assert metadata_of(body) == {"test_mode": "validator", "criteria": 'Mentions "expense"'}
    system, *rest = body["messages"]
    assert system["role"] == "system"
    assert 'Criteria: Mentions "expense"' in system["content"]
    assert "whole conversation" not in system["content"]
    assert rest == messages


def test_an_assertions_params_go_over_the_judge_entrys_params(server: AgentServer) -> None:
    server.script(CHAT, *[Reply(body=completion('{"passed": true}'))] * 2)
    helper = openai(server.url("/v1"), "helper", params={"temperature": 0.7, "seed": 3})
    config = ProjectConfig(agents={"helper": helper}, defaults=Defaults(judge="helper"))
    session = AgentPool(config).session([])
    judge(session, CONVERSATION, "polite", params={"temperature": 0, "top_p": 0.5})
    judge(session, CONVERSATION, "polite")
    asked, plain = server.bodies(CHAT)
    assert (asked["temperature"], asked["seed"], asked["top_p"]) == (0, 3, 0.5)
    assert (plain["temperature"], plain["seed"], "top_p" in plain) == (0.7, 3, False)


def test_validator_sees_the_whole_conversation_when_given_one(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion('{"passed": true}')))
    judge(scripted_session(server, []), CONVERSATION, "remembers the amount")
    system, *rest = server.bodies(CHAT)[0]["messages"]
    assert "in the context of the whole conversation" in system["content"]
    assert rest == FOLDED


@pytest.mark.parametrize(
    ("content", "passed", "reason"),
    [
        ('{"pass": true, "reason": "tdx"}', True, "tdx"),
        (
            'Verdict:\n```json\n{"result": "fail", "reason": "wrong total"}\n```',
            False,
            "wrong total",
        ),
        ('{"passed": false}', False, "failed"),
        ('{"passed": true}', True, "passed"),
    ],
)
def test_validator_verdict_forms(
    server: AgentServer, content: str, passed: bool, reason: str
) -> None:
    server.script(CHAT, Reply(body=completion(content)))
    outcome = judge(scripted_session(server, []), CONVERSATION[:3], "anything")
    assert (outcome.passed, outcome.reason, outcome.error) == (passed, reason, None)


def test_a_verdict_missing_is_an_error_outcome_not_an_exception(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion('{"score": 0.7, "reason": "looks fine"}')))
    outcome = judge(scripted_session(server, []), CONVERSATION[:3], "anything")
    assert outcome.passed is False
    assert outcome.error is not None and "no `passed` verdict" in outcome.error
    assert outcome.reason.startswith("judge helper")


def test_a_failing_judge_is_an_error_outcome(server: AgentServer) -> None:
    server.always(CHAT, Reply(404, body={"error": {"message": "no such model"}}))
    log: list[AgentCallRecord] = []
    outcome = judge(scripted_session(server, log), CONVERSATION[:3], "anything")
    assert outcome.passed is False
    assert outcome.error is not None and "no such model" in outcome.error
    assert len(server.requests(CHAT)) == 1
    assert [r.status_code for r in log] == [404]


def test_no_judge_configured_is_an_error_outcome() -> None:
    session = AgentPool(ProjectConfig()).session([])
    outcome = judge(session, CONVERSATION[:3], "anything")
    assert outcome.passed is False and outcome.error == "no judge configured"


def test_judge_through_the_demo_validator(demo_url: str) -> None:
    log: list[AgentCallRecord] = []
    session = demo_session(demo_url, log)
    messages = [
        {"role": "user", "content": "Submit $100,000 equipment purchase"},
        {"role": "assistant", "content": "This requires manager approval. Please provide PO."},
    ]
    good = judge(session, messages, 'Must mention "manager approval" and not "rejected"')
    assert good.passed is True and good.error is None
    assert good.score == 1.0
    assert good.reason == 'found "manager approval"; avoided "rejected"'
    assert good.suggestions == []
    bad = judge(
        session,
        messages,
        'Must mention "PO number" and "approved"',
        use="agents:workers.test.validator",
    )
    assert bad.passed is False and bad.error is None
    assert bad.score == 0.0
    assert bad.suggestions == ["PO number", "approved"]
    assert [(r.role, r.agent) for r in log] == [("validator", "workers.test.validator")] * 2


def test_judge_connector_picks_another_registry_agent(demo_url: str, server: AgentServer) -> None:
    config = ProjectConfig(
        agents={
            "workers.test.validator": openai(demo_url, "validator"),
            "other": openai(server.url("/v1"), "other"),
        },
        defaults=Defaults(judge="workers.test.validator"),
    )
    server.script(CHAT, Reply(body=completion('{"passed": false, "reason": "other judge"}')))
    outcome = judge(AgentPool(config).session([]), CONVERSATION[:3], "x", connector="other")
    assert outcome.reason == "other judge"


# -- generator ---------------------------------------------------------------------------------


def test_generator_through_the_demo_generator(demo_url: str) -> None:
    log: list[AgentCallRecord] = []
    metadata = {"target_agent": "assistants.expense", "count": 4, "focus": "edge-cases"}
    cases = run(demo_session(demo_url, log).generate("agents:workers.test.generator", metadata))
    assert [case["id"] for case in cases] == ["G001", "G002", "G003", "G004"]
    assert cases[0]["name"] == "Greeting (edge-cases)"
    assert cases[3]["input"] == "Hello"
    assert [r.role for r in log] == ["generator"]


def test_generator_request_shape_on_the_wire(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion('Here:\n```json\n{"cases": [{"id": "X"}]}\n```')))
    metadata = {
        "target_agent": "assistants.expense",
        "target_description": "Expense assistant",
        "target_tools": ["create_expense"],
        "count": 2,
        "focus": "approvals",
    }
    cases = run(scripted_session(server, []).generate("agents:helper", metadata))
    assert cases == [{"id": "X"}]
    [body] = server.bodies(CHAT)
    assert metadata_of(body) == {"test_mode": "generator", **metadata}
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    for text in [
        "Target Agent: assistants.expense",
        "Description: Expense assistant",
        'Available Tools: ["create_expense"]',
        "Generate 2 test cases with focus on: approvals",
    ]:
        assert text in system["content"]


def test_generator_junk_is_a_parse_error(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("I cannot do that")))
    log: list[AgentCallRecord] = []
    with pytest.raises(AgentError) as caught:
        run(scripted_session(server, log).generate("agents:helper", {}))
    assert caught.value.kind == "parse"
    assert caught.value.raw == "I cannot do that"
    assert log[0].error == caught.value.message


def test_role_calls_use_agent_requests_with_roles(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("plain")))
    log: list[AgentCallRecord] = []
    request = AgentRequest(role="reporter", messages=[{"role": "user", "content": "x"}])
    reply = run(scripted_session(server, log).call("agents:helper", request))
    assert reply.content == "plain"
    assert [(r.role, r.agent) for r in log] == [("reporter", "helper")]
