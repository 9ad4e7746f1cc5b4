"""The openai protocol over real HTTP: what is sent, how replies are read, what is recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from agent_servers import AgentServer, Reply, completion, run, tool_call

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.protocols.openai import OpenAIClient
from agenttest_worker.results import AgentRole, ToolCall, Usage

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as running:
        yield running


def agent(server: AgentServer, **fields: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "protocol": "openai",
        "base_url": server.url("/v1"),
        "model": "expense",
        "timeout": 5,
        "base_delay": 0.01,
        **fields,
    }
    return AgentConfig.model_validate(settings)


def call(
    config: AgentConfig,
    *,
    role: AgentRole = "target",
    messages: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
    name: str = "assistants.expense",
) -> AgentReply:
    request = AgentRequest(role=role, messages=messages or HELLO, metadata=metadata or {})
    return run(OpenAIClient(name, config).complete(request))


def failure(config: AgentConfig, **kwargs: Any) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call(config, **kwargs)
    return caught.value


# -- the request ---------------------------------------------------------------------------


def test_request_body_has_model_messages_and_metadata_object(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
    ]
    metadata = {"locale": "fr", "nested": {"a": [1, 2]}, "flag": True}
    call(agent(server, metadata="object"), messages=messages, metadata=metadata)
    [request] = server.requests(CHAT)
    assert request.method == "POST"
    assert request.headers["Content-Type"] == "application/json"
    # OpenAI takes `metadata` only on a completion it stores.
    assert request.json == {
        "model": "expense",
        "messages": messages,
        "metadata": metadata,
        "store": True,
    }


def test_by_default_the_body_is_what_chat_completions_takes(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    messages = [{"role": "user", "content": "Hello"}]
    call(agent(server), messages=messages, metadata={"locale": "fr"})
    assert server.bodies(CHAT)[0] == {"model": "expense", "messages": messages}


def test_model_defaults_to_the_agent_name(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    call(agent(server, model=None), name="workers.echo")
    assert server.bodies(CHAT)[0]["model"] == "workers.echo"


def test_empty_metadata_is_not_sent(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    call(agent(server, metadata="object"), metadata={})
    assert not {"metadata", "store"} & server.bodies(CHAT)[0].keys()


def test_metadata_none_sends_no_metadata(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    call(agent(server, metadata="none"), metadata={"persona": "x"})
    assert "metadata" not in server.bodies(CHAT)[0]


def test_metadata_strings_json_encodes_and_keeps_openai_limits(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    metadata: dict[str, Any] = {
        "persona": "café owner",
        "max_turns": 8,
        "flag": True,
        "nothing": None,
        "nested": {"goal": "file", "ids": [1, 2]},
        "long": "x" * 600,
        "k" * 70: "long key",
    }
    metadata.update({f"extra{i:02d}": i for i in range(20)})
    call(agent(server, metadata="strings"), metadata=metadata)
    sent = server.bodies(CHAT)[0]["metadata"]
    assert len(sent) == 16  # OpenAI's limit; the first 16 keys in order are kept
    assert list(sent)[:7] == [
        "persona",
        "max_turns",
        "flag",
        "nothing",
        "nested",
        "long",
        "k" * 64,
    ]
    assert all(isinstance(value, str) for value in sent.values())
    assert sent["persona"] == "café owner"
    assert sent["max_turns"] == "8"
    assert sent["flag"] == "true"
    assert sent["nothing"] == "null"
    assert json.loads(sent["nested"]) == {"goal": "file", "ids": [1, 2]}
    assert sent["long"] == "x" * 512
    assert sent["k" * 64] == "long key"
    assert "extra08" in sent and "extra09" not in sent


def test_tools_are_sent_only_to_the_target(server: AgentServer) -> None:
    tools = [
        "create_expense",
        {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {}}}},
        {"type": "function", "function": {"name": "full"}},
    ]
    config = agent(server, tools=tools)
    server.script(CHAT, Reply(body=completion("hi")), Reply(body=completion("{}")))
    call(config, role="target")
    call(config, role="simulator")
    target, simulator = server.bodies(CHAT)
    assert target["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "create_expense",
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {}}},
            },
        },
        {"type": "function", "function": {"name": "full"}},
    ]
    assert "tools" not in simulator


def test_authorization_comes_from_api_key_env(
    server: AgentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_TEST_KEY", "sk-secret-123")
    server.script(CHAT, Reply(body=completion("hi")))
    call(agent(server, api_key_env="AGENT_TEST_KEY", headers={"X-Tenant": "acme"}))
    [request] = server.requests(CHAT)
    assert request.headers["Authorization"] == "Bearer sk-secret-123"
    assert request.headers["X-Tenant"] == "acme"


@pytest.mark.parametrize("value", [None, ""])
def test_no_authorization_when_the_key_variable_is_unset_or_empty(
    server: AgentServer, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("AGENT_TEST_KEY", raising=False)
    else:
        monkeypatch.setenv("AGENT_TEST_KEY", value)
    server.script(CHAT, Reply(body=completion("hi")))
    call(agent(server, api_key_env="AGENT_TEST_KEY"))
    assert "Authorization" not in server.requests(CHAT)[0].headers


def test_the_key_is_read_at_call_time(server: AgentServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_TEST_KEY", raising=False)
    client = OpenAIClient("a", agent(server, api_key_env="AGENT_TEST_KEY"))
    monkeypatch.setenv("AGENT_TEST_KEY", "late-key")
    server.script(CHAT, Reply(body=completion("hi")))
    run(client.complete(AgentRequest(role="target", messages=HELLO)))
    assert server.requests(CHAT)[0].headers["Authorization"] == "Bearer late-key"


# -- the reply -------------------------------------------------------------------------------


def test_string_content_finish_reason_and_usage(server: AgentServer) -> None:
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    server.script(CHAT, Reply(body=completion("Hello there", usage=usage)))
    reply = call(agent(server))
    assert reply.content == "Hello there"
    assert reply.finish_reason == "stop"
    assert reply.tool_calls == []
    assert reply.awaiting_input is None
    assert reply.usage == Usage(prompt_tokens=12, completion_tokens=5, total_tokens=17)
    assert reply.call is not None and reply.call.usage == reply.usage


def test_content_parts_list_is_joined_text(server: AgentServer) -> None:
    parts = [
        {"type": "text", "text": "Hello "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "output_text", "text": "world"},
    ]
    server.script(CHAT, Reply(body=completion(parts)))
    assert call(agent(server)).content == "Hello world"


def test_tool_calls_arguments_are_parsed_or_kept_as_text(server: AgentServer) -> None:
    calls = [
        tool_call("create_expense", {"amount": 3500, "type": "travel"}, "call_a"),
        tool_call("lookup", "{not json", "call_b"),
        tool_call("noargs", "", "call_c"),
    ]
    server.script(CHAT, Reply(body=completion(None, tool_calls=calls)))
    reply = call(agent(server))
    assert reply.content is None
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [
        ToolCall(name="create_expense", args={"amount": 3500, "type": "travel"}, id="call_a"),
        ToolCall(name="lookup", args="{not json", id="call_b"),
        ToolCall(name="noargs", args={}, id="call_c"),
    ]
    # The history keeps the calls exactly as the agent sent them.
    assert reply.assistant_message() == {"role": "assistant", "content": None, "tool_calls": calls}


@pytest.mark.parametrize("where", ["top", "message"])
def test_declared_awaiting_input_hint_and_state(server: AgentServer, where: str) -> None:
    declared: dict[str, Any] = {
        "awaiting_input": "true" if where == "top" else True,
        "input_hint": "PO number",
        "state": {"expense": {"status": "draft"}},
    }
    body = (
        completion("Need a PO", **declared)
        if where == "top"
        else completion("Need a PO", message_extra=declared)
    )
    server.script(CHAT, Reply(body=body))
    reply = call(agent(server))
    assert reply.awaiting_input is True
    assert reply.input_hint == "PO number"
    assert reply.state == {"expense": {"status": "draft"}}


def test_a_null_on_the_message_does_not_hide_the_top_level_field(server: AgentServer) -> None:
    body = completion("Done", message_extra={"awaiting_input": None}, awaiting_input=False)
    server.script(CHAT, Reply(body=body))
    assert call(agent(server)).awaiting_input is False


def test_an_error_body_is_an_agent_error(server: AgentServer) -> None:
    server.script(CHAT, Reply(body={"error": {"message": "model overloaded", "type": "server"}}))
    error = failure(agent(server))
    assert error.kind == "http"
    assert "model overloaded" in error.message
    assert error.call is not None and error.call.status_code == 200
    assert len(server.requests(CHAT)) == 1


def test_a_string_error_body_is_an_agent_error(server: AgentServer) -> None:
    server.script(CHAT, Reply(body={"error": "quota exceeded"}))
    error = failure(agent(server))
    assert error.kind == "http"
    assert "quota exceeded" in error.message


@pytest.mark.parametrize(
    "body", [{"id": "x", "choices": []}, {"id": "x"}, {"choices": ["text"]}, [1, 2]]
)
def test_no_choices_is_a_parse_error_with_the_call_recorded(server: AgentServer, body: Any) -> None:
    server.script(CHAT, Reply(body=body))
    error = failure(agent(server))
    assert error.kind == "parse"
    assert "assistants.expense" in error.message
    assert error.call is not None
    assert error.call.status_code == 200 and error.call.attempts == 1
    assert error.call.error == error.message
    assert error.raw == json.dumps(body)


def test_odd_usage_values_do_not_break_the_reply(server: AgentServer) -> None:
    usage = {"prompt_tokens": "many", "completion_tokens": 3.0, "total_tokens": None}
    server.script(CHAT, Reply(body=completion("hi", usage=usage)))
    assert call(agent(server)).usage == Usage(prompt_tokens=0, completion_tokens=3, total_tokens=0)


def test_call_record_has_latency_attempts_status_and_usage(server: AgentServer) -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    server.script(CHAT, Reply(body=completion("slow", usage=usage), delay=0.1))
    reply = call(agent(server), role="validator", name="workers.judge")
    record = reply.call
    assert record is not None
    assert record.role == "validator"
    assert record.agent == "workers.judge"
    assert 100 <= record.latency_ms < 2000
    assert record.attempts == 1
    assert record.status_code == 200
    assert record.usage == Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    assert record.error is None


def test_base_url_trailing_slash(server: AgentServer) -> None:
    server.script(CHAT, Reply(body=completion("hi")))
    call(agent(server, base_url=server.url("/v1/")))
    assert [r.path for r in server.requests()] == [CHAT]
