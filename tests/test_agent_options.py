"""The spec's context.Options on the wire: `skip`, `search` and `mode` of a case (merged
case < turn) reach the target beside `metadata`, as `options`, over real HTTP, where the
agent entry asks for metadata (by default an http agent does, a hosted API's does not);
and model parameters (`params` on the entry, the case's and the simulator's options)
reach the body under the provider's names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agent_servers import AgentServer
from agent_servers import Reply as ServerReply
from scripted_agent import ScriptedAgent, project, run_case, simulator_turn

CASE: dict[str, Any] = {
    "id": "O",
    "type": "multi_turn",
    "options": {
        "skip": {"history": True, "trace": False},
        "search": {"sources": ["policy"], "limit": 3},
        "mode": "chat",
        "metadata": {"locale": "fr"},
    },
    "turns": [
        {"input": "first"},
        # The turn replaces the case's scalars and merges its metadata.
        {"input": "second", "options": {"mode": "task", "metadata": {"step": 2}}},
    ],
}
FIRST = {
    "skip": {"history": True, "trace": False},
    "search": {"sources": ["policy"], "limit": 3},
    "mode": "chat",
}
SECOND = {**FIRST, "mode": "task"}


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        yield server


def test_openai_sends_options_beside_metadata(agent: ScriptedAgent) -> None:
    agent.script("target", ["One.", "Two."])
    entry = {**agent.entry("target"), "metadata": "object"}
    result, _ = run_case(CASE, project({"target": entry}))
    assert result.status == "passed", result
    first, second = agent.requests("target")
    assert first["options"] == FIRST
    assert first["metadata"] == {"locale": "fr"}
    assert second["options"] == SECOND
    assert second["metadata"] == {"locale": "fr", "step": 2}
    # OpenAI takes `metadata` only on a completion it stores.
    assert first["store"] is True


def test_openai_sends_neither_metadata_nor_options_by_default(agent: ScriptedAgent) -> None:
    agent.script("target", ["One.", "Two."])
    result, _ = run_case(CASE, project({"target": agent.entry("target")}))
    assert result.status == "passed", result
    for body in agent.requests("target"):
        assert not {"metadata", "options", "store"} & body.keys(), body


def test_params_reach_the_body_and_the_case_overrides_them(agent: ScriptedAgent) -> None:
    agent.script("target", ["One.", "Two."])
    entry = {
        **agent.entry("target"),
        "params": {"temperature": 0, "seed": 7, "response_format": {"type": "json_object"}},
    }
    case = {
        **CASE,
        "options": {**CASE["options"], "params": {"seed": 8, "max_completion_tokens": 50}},
        "turns": [
            {"input": "first"},
            {"input": "second", "options": {"params": {"temperature": 0.5}}},
        ],
    }
    result, _ = run_case(case, project({"target": entry}))
    assert result.status == "passed", result
    first, second = agent.requests("target")
    assert first["temperature"] == 0 and first["seed"] == 8
    assert first["response_format"] == {"type": "json_object"}
    assert first["max_completion_tokens"] == 50
    assert second["temperature"] == 0.5 and second["seed"] == 8


def test_metadata_strings_and_a_store_param(agent: ScriptedAgent) -> None:
    agent.script("target", ["One."])
    entry = {**agent.entry("target"), "metadata": "strings", "params": {"store": False}}
    run_case(
        {"id": "S", "input": "hi", "options": {"metadata": {"n": 1}}}, project({"target": entry})
    )
    [body] = agent.requests("target")
    assert body["metadata"] == {"n": "1"}
    # `params` says otherwise: it wins.
    assert body["store"] is False


def test_a_param_the_runner_writes_is_refused() -> None:
    with pytest.raises(ValueError, match="model cannot be a param"):
        project({"target": {"base_url": "http://127.0.0.1:9/v1", "params": {"model": "x"}}})


def test_anthropic_params_take_the_messages_api_names() -> None:
    with AgentServer() as server:
        server.always(
            "/v1/messages",
            ServerReply(
                body={
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude",
                    "content": [{"type": "text", "text": "ok"}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
            ),
        )
        entry = {
            "protocol": "anthropic",
            "base_url": server.url(""),
            "max_retries": 0,
            "params": {"max_tokens": 64, "temperature": 0, "stop_sequences": ["END"]},
        }
        case = {"id": "A", "input": "hi", "options": {"metadata": {"a": 1}}}
        result, _ = run_case(case, project({"target": entry}))
        assert result.status == "passed", result
        [body] = server.bodies("/v1/messages")
    assert body["max_tokens"] == 64 and body["temperature"] == 0
    assert body["stop_sequences"] == ["END"]
    assert "metadata" not in body


def test_http_default_body_carries_params_as_its_own_keys() -> None:
    with AgentServer() as server:
        server.always("/chat", ServerReply(body={"content": "ok"}))
        run_case({"id": "H", "input": "hi"}, _http_project(server, params={"temperature": 0}))
        run_case({"id": "N", "input": "hi"}, _http_project(server, metadata="none"))
        [with_params, without_metadata] = server.bodies("/chat")
    assert with_params["temperature"] == 0 and with_params["metadata"] == {}
    assert "metadata" in without_metadata and without_metadata["metadata"] == {}


def test_openai_sends_no_options_when_the_case_sets_none(agent: ScriptedAgent) -> None:
    agent.script("target", ["One."])
    case = {"id": "P", "input": "hi", "options": {"metadata": {"a": "b"}, "connector": "x"}}
    run_case(case, project({"target": {**agent.entry("target"), "metadata": "object"}}))
    [body] = agent.requests("target")
    # `connector` picks a registry entry; it is not the agent's business.
    assert "options" not in body


def _http_project(server: AgentServer, **entry: Any) -> Any:
    settings = {"protocol": "http", "url": server.url("/chat"), "max_retries": 0, **entry}
    return project({"target": settings})


def test_http_default_body_carries_options() -> None:
    with AgentServer() as server:
        server.always("/chat", ServerReply(body={"content": "ok"}))
        result, _ = run_case(CASE, _http_project(server))
        assert result.status == "passed", result
        first, second = server.bodies("/chat")
    assert first["options"] == FIRST and first["metadata"] == {"locale": "fr"}
    assert second["options"] == SECOND


def test_http_template_placeholder_options() -> None:
    template = {"q": "{{input}}", "opts": "{{options}}", "note": "mode={{options}}"}
    with AgentServer() as server:
        server.always("/chat", ServerReply(body={"content": "ok"}))
        run_case(CASE, _http_project(server, request=template))
        run_case({"id": "N", "input": "plain"}, _http_project(server, request=template))
        first, _, plain = server.bodies("/chat")
    assert first["opts"] == FIRST
    assert first["note"].startswith('mode={"skip": {"history": true')
    # A case without options still fills the placeholder: an empty object.
    assert plain["opts"] == {}


def test_a_simulator_gets_its_own_params(agent: ScriptedAgent) -> None:
    agent.script("target", ["What is your name?", "Thanks, done."])
    agent.script("sim", [simulator_turn("Alice")])
    entries = {
        "target": {**agent.entry("target"), "params": {"temperature": 0.7}},
        "sim": {**agent.entry("sim"), "params": {"temperature": 1}},
    }
    case = {
        "id": "SP",
        "type": "multi_turn",
        "turns": [{"input": "hi"}],
        "simulator": {"use": "agents:sim", "options": {"params": {"seed": 3}}},
        "on_missing_input": "end",
    }
    run_case(case, project(entries))
    [sim] = agent.requests("sim")
    assert sim["temperature"] == 1 and sim["seed"] == 3
    assert all(body["temperature"] == 0.7 for body in agent.requests("target"))
    assert all("seed" not in body for body in agent.requests("target"))
