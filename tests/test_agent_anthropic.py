"""The anthropic protocol over real HTTP: the Messages request, replies whole and
streamed, tool_use and tool_result blocks, images, errors, and the helper roles.

The test server writes the Messages wire format (tests/stream_servers.py); the official
`anthropic` client reads it first, as a check that it is the real one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from agent_servers import Reply, run
from scripted_agent import project, run_case
from stream_servers import (
    Stream,
    StreamServer,
    anthropic_error,
    anthropic_events,
    anthropic_message,
    sse,
)

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.http.exchange import close_session
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.agents.protocols.anthropic import AnthropicClient
from agenttest_worker.results import AgentCallRecord, ToolCall, Usage

MESSAGES = "/v1/messages"
KEY_ENV = "AGENTTEST_ANTHROPIC_TEST_KEY"
KEY = "sk-ant-test-5f1e0c"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[StreamServer]:
    monkeypatch.setenv(KEY_ENV, KEY)
    with StreamServer() as running:
        yield running


def entry(server: StreamServer, **fields: Any) -> dict[str, Any]:
    return {
        "protocol": "anthropic",
        "base_url": server.url(),
        "model": "claude-test",
        "api_key_env": KEY_ENV,
        "timeout": 2,
        "base_delay": 0.01,
        "max_retries": 2,
        **fields,
    }


def call(
    server: StreamServer, messages: list[dict[str, Any]] | None = None, **fields: Any
) -> AgentReply:
    config = AgentConfig.model_validate(entry(server, **fields))
    request = AgentRequest(role="target", messages=messages or [{"role": "user", "content": "Hi"}])
    return run(AnthropicClient("claude", config).complete(request))


def failure(server: StreamServer, **fields: Any) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call(server, **fields)
    return caught.value


# -- the wire format, read by the official client -------------------------------------------


def test_the_official_anthropic_client_reads_the_test_server(server: StreamServer) -> None:
    client = anthropic.Anthropic(base_url=server.url(), api_key=KEY, max_retries=0)
    hi = [{"role": "user", "content": "Hi"}]
    server.script(MESSAGES, Reply(body=anthropic_message("Hello!")))
    whole = client.messages.create(model="claude-test", max_tokens=64, messages=hi)
    assert [b.type for b in whole.content] == ["text"] and whole.stop_reason == "end_turn"

    tool = ("toolu_1", "lookup", ['{"ci', 'ty": "Oslo"}'])
    server.script(MESSAGES, Stream(anthropic_events(["Let me ", "check."], tool_uses=[tool])))
    with client.messages.stream(model="claude-test", max_tokens=64, messages=hi) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "Let me check."
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Oslo"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 5

    server.script(
        MESSAGES, Reply(401, body=anthropic_error("authentication_error", "invalid x-api-key"))
    )
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client.messages.create(model="claude-test", max_tokens=64, messages=hi)
    assert caught.value.body == anthropic_error("authentication_error", "invalid x-api-key")


# -- the request -------------------------------------------------------------------------


def test_the_request_is_a_messages_request(server: StreamServer) -> None:
    server.script(MESSAGES, Reply(body=anthropic_message("Hello!")))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    reply = call(server, messages, max_tokens=256, anthropic_version="2023-06-01")
    [request] = server.requests(MESSAGES)
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in request.headers
    assert request.json == {
        "model": "claude-test",
        "max_tokens": 256,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }
    assert reply.content == "Hello!"
    assert reply.usage == Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    assert reply.call is not None and reply.call.stop_reason == "end_turn"


def test_a_base_url_ending_in_v1_is_not_doubled(server: StreamServer) -> None:
    server.script(MESSAGES, Reply(body=anthropic_message("ok")))
    assert call(server, base_url=server.url("/v1")).content == "ok"


def test_images_travel_as_base64_image_blocks(server: StreamServer) -> None:
    server.script(
        MESSAGES, Reply(body=anthropic_message("A receipt.")), Reply(body=anthropic_message("ok"))
    )
    config = project({"target": entry(server)})
    case = {
        "id": "IMG",
        "input": "What is this?",
        "attachments": [
            {"type": "image", "source": f"data:image/png;base64,{PNG}"},
            {"type": "image", "source": "https://example.test/r.jpg"},
        ],
    }
    result, _ = run_case(case, config)
    assert result.status == "passed"
    [user] = server.bodies(MESSAGES)[0]["messages"]
    assert user["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.test/r.jpg"}},
    ]


# -- tool_use and tool_mocks -----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_use_is_answered_from_tool_mocks_with_tool_result_blocks(
    server: StreamServer, stream: bool
) -> None:
    if stream:
        first: Reply | Stream = Stream(
            anthropic_events(
                ["Checking."], tool_uses=[("toolu_7", "get_rate", ['{"cur', 'rency": "EUR"}'])]
            )
        )
        second: Reply | Stream = Stream(anthropic_events(["The rate is 1.1."]))
    else:
        first = Reply(
            body=anthropic_message(
                "Checking.", tool_uses=[("toolu_7", "get_rate", {"currency": "EUR"})]
            )
        )
        second = Reply(body=anthropic_message("The rate is 1.1."))
    server.script(MESSAGES, first, second)
    config = project(
        {
            "target": entry(
                server, stream=stream, tools=[{"name": "get_rate", "description": "FX rate"}]
            )
        }
    )
    case = {
        "id": "TOOLS",
        "input": "EUR rate?",
        "tool_mocks": {"get_rate": {"rate": 1.1}},
        "assertions": [
            {"type": "tool_called", "name": "get_rate"},
            {"type": "contains", "value": "1.1"},
        ],
    }
    result, _ = run_case(case, config)
    [turn] = result.turns
    assert result.status == "passed", turn
    assert turn.tool_calls == [ToolCall(name="get_rate", args={"currency": "EUR"}, id="toolu_7")]
    assert turn.tool_results == {"get_rate": {"rate": 1.1}}
    first_body, second_body = server.bodies(MESSAGES)
    assert first_body["tools"] == [
        {
            "name": "get_rate",
            "description": "FX rate",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    assert second_body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_7",
                    "name": "get_rate",
                    "input": {"currency": "EUR"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_7", "content": '{"rate": 1.1}'}
            ],
        },
    ]
    assert [c.stop_reason for c in turn.calls or []] == ["tool_use", "end_turn"]
    if stream:
        assert turn.first_token_ms is not None and turn.response_ms is not None


# -- streaming ---------------------------------------------------------------------------------


def test_a_streamed_message_is_assembled_with_usage_and_stop_reason(server: StreamServer) -> None:
    server.script(
        MESSAGES,
        Stream(anthropic_events(["Hel", "lo ", "there"], input_tokens=30, output_tokens=9)),
    )
    reply = call(server, stream=True)
    assert server.bodies(MESSAGES)[0]["stream"] is True
    assert reply.content == "Hello there"
    assert reply.finish_reason == "end_turn"
    assert reply.usage == Usage(prompt_tokens=30, completion_tokens=9, total_tokens=39)
    assert reply.call is not None and reply.call.first_token_ms is not None
    assert reply.call.stop_reason == "end_turn"


def test_a_stream_cut_before_message_stop_fails_keeping_its_text(server: StreamServer) -> None:
    events = anthropic_events(["Partial ", "answer"], stop=False)
    server.script(MESSAGES, Stream(events[:-1], end="cut"))
    caught = failure(server, stream=True)
    assert caught.partial is not None and caught.partial.content == "Partial answer"
    assert len(server.requests(MESSAGES)) == 1


def test_an_overloaded_error_event_before_content_is_retried(server: StreamServer) -> None:
    start = anthropic_events(["x"])[0]
    overloaded = sse(anthropic_error("overloaded_error", "Overloaded"), "error")
    server.script(
        MESSAGES,
        Stream([start, overloaded]),
        Stream(anthropic_events(["Fine now."])),
    )
    reply = call(server, stream=True)
    assert reply.content == "Fine now."
    assert reply.call is not None and reply.call.attempts == 2


def test_an_error_event_after_content_fails_at_once(server: StreamServer) -> None:
    events = anthropic_events(["Half"])[:4]  # message_start, block start, ping, one delta
    overloaded = sse(anthropic_error("overloaded_error", "Overloaded"), "error")
    server.script(MESSAGES, Stream([*events, overloaded]))
    caught = failure(server, stream=True)
    assert "overloaded_error: Overloaded" in caught.message
    assert caught.partial is not None and caught.partial.content == "Half"
    assert len(server.requests(MESSAGES)) == 1


# -- error bodies ------------------------------------------------------------------------------


def test_an_error_body_is_reported_by_its_type_and_message(server: StreamServer) -> None:
    server.script(
        MESSAGES, Reply(401, body=anthropic_error("authentication_error", "invalid x-api-key"))
    )
    caught = failure(server)
    assert (
        caught.message
        == "agent error: HTTP 401 from claude: authentication_error: invalid x-api-key"
    )
    assert len(server.requests(MESSAGES)) == 1
    assert caught.call is not None and KEY not in json.dumps(caught.call.model_dump())


def test_overloaded_529_is_retried(server: StreamServer) -> None:
    server.script(
        MESSAGES,
        Reply(529, body=anthropic_error("overloaded_error", "Overloaded")),
        Reply(body=anthropic_message("ok")),
    )
    reply = call(server)
    assert reply.content == "ok" and reply.call is not None and reply.call.attempts == 2


def test_a_529_that_persists_says_so(server: StreamServer) -> None:
    busy = Reply(529, body=anthropic_error("overloaded_error", "Overloaded"))
    server.script(MESSAGES, busy, busy, busy)
    caught = failure(server)
    assert caught.message == (
        "agent error: HTTP 529 from claude: overloaded_error: Overloaded (after 3 attempts)"
    )


# -- the helper roles ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_judges_and_simulates(server: StreamServer, stream: bool) -> None:
    def answer(text: str) -> Reply | Stream:
        return (
            Stream(anthropic_events([text[:5], text[5:]]))
            if stream
            else Reply(body=anthropic_message(text))
        )

    server.script(
        MESSAGES,
        answer("Which city?"),  # the target
        answer(json.dumps({"passed": True, "score": 0.9, "reason": "asks for the city"})),  # judge
        answer(
            json.dumps({"input": "Oslo", "goal_achieved": False, "reasoning": "answer"})
        ),  # simulator
        answer("Booked for Oslo."),  # the target again: done, so no simulator call follows
    )
    config = project(
        {"target": entry(server, stream=stream)},
        defaults={"judge": "target", "simulator": "target"},
    )
    case = {
        "id": "ROLES",
        "input": "Book a trip",
        "assertions": [
            {"type": "agent", "options": {"metadata": {"criteria": "asks for the city"}}}
        ],
        "simulator": {"use": "agents:target", "metadata": {"goal": "book a trip", "max_turns": 3}},
    }
    result, _ = run_case(case, config)
    assert result.status == "passed", result
    assert [t.input for t in result.turns] == ["Book a trip", "Oslo"]
    assert result.turns[0].assertions[0].reason == "asks for the city"
    bodies = server.bodies(MESSAGES)
    judge, simulator = bodies[1], bodies[2]
    assert judge["system"].startswith("You are a strict evaluator")
    assert simulator["system"].startswith("You are simulating a user")
    # The conversation as one transcript, a user message (the simulator's default).
    [transcript] = simulator["messages"]
    assert transcript["role"] == "user"
    [text] = transcript["content"]
    assert text["text"].startswith("Current conversation:\nUser: Book a trip")
    roles = [c.role for t in result.turns for c in t.calls or []]
    assert roles == ["target", "validator", "simulator", "target"]


def test_an_anthropic_generator_writes_cases(server: StreamServer) -> None:
    cases = {"cases": [{"id": "G1", "input": "Hello"}]}
    server.script(MESSAGES, Reply(body=anthropic_message(f"```json\n{json.dumps(cases)}\n```")))
    config = project({"gen": entry(server)})
    log: list[AgentCallRecord] = []

    async def generate() -> list[Any]:
        try:
            return await AgentPool(config).session(log).generate("agents:gen", {"count": 1})
        finally:
            await close_session()

    import asyncio

    assert asyncio.run(generate()) == cases["cases"]
    body = server.bodies(MESSAGES)[0]
    assert body["system"].startswith("You are a test case generator")
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Generate the test cases now."}]}
    ]
    assert log[0].role == "generator"
