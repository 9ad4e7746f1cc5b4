"""Streamed replies over real HTTP: Chat Completions SSE and http sse/ndjson agents.

The servers (tests/stream_servers.py) write the wire formats; the official `openai`
client reads them first, as a check that they are the real format.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agent_servers import Reply, completion, run
from scripted_agent import project, run_case
from stream_servers import Piece, Stream, StreamServer, openai_chunks, sse

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.protocols.http import HttpAgentClient
from agenttest_worker.agents.protocols.openai import OpenAIClient
from agenttest_worker.results import ToolCall, Usage

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]
USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
TWO_CALLS = [
    ("call_a", "lookup", ['{"cit', 'y": "Par', 'is"}']),
    ("call_b", "convert", ['{"amount": 1', "2.5, ", '"to": "EUR"}']),
]


@pytest.fixture
def server() -> Iterator[StreamServer]:
    with StreamServer() as running:
        yield running


def agent(server: StreamServer, **fields: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "protocol": "openai",
        "base_url": server.url("/v1"),
        "model": "m",
        "stream": True,
        "timeout": 2,
        "base_delay": 0.01,
        **fields,
    }
    return AgentConfig.model_validate(settings)


def call(
    config: AgentConfig, client: type[OpenAIClient | HttpAgentClient] = OpenAIClient
) -> AgentReply:
    request = AgentRequest(role="target", messages=HELLO)
    return run(client("streamer", config).complete(request))


def failure(
    config: AgentConfig, client: type[OpenAIClient | HttpAgentClient] = OpenAIClient
) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call(config, client)
    return caught.value


# -- the wire format, read by the official client -------------------------------------------


def test_the_official_openai_client_reads_the_test_stream(server: StreamServer) -> None:
    server.script(CHAT, Stream(openai_chunks(["Hel", "lo"], tool_calls=TWO_CALLS, usage=USAGE)))
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="sk-test", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments[piece.index] = arguments.get(piece.index, "") + (
                piece.function.arguments or ""
            )
    assert text == "Hello"
    assert [json.loads(a) for a in arguments.values()] == [
        {"city": "Paris"},
        {"amount": 12.5, "to": "EUR"},
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 19
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


# -- assembling --------------------------------------------------------------------------


def test_deltas_are_assembled_with_usage_finish_reason_and_first_token(
    server: StreamServer,
) -> None:
    pieces: list[Piece | bytes] = list(openai_chunks(["Hello", ", ", "world"], usage=USAGE))
    pieces[1] = Piece(pieces[1].data if isinstance(pieces[1], Piece) else pieces[1], delay=0.1)
    server.script(CHAT, Stream(pieces))
    reply = call(agent(server))
    assert reply.content == "Hello, world"
    assert reply.finish_reason == "stop"
    assert reply.usage == Usage(prompt_tokens=12, completion_tokens=7, total_tokens=19)
    assert reply.call is not None
    assert reply.call.usage == reply.usage
    assert reply.call.stop_reason == "stop"
    assert reply.call.first_token_ms is not None and reply.call.first_token_ms >= 100
    assert reply.call.latency_ms >= reply.call.first_token_ms
    [request] = server.requests(CHAT)
    assert request.json["stream"] is True
    assert request.json["stream_options"] == {"include_usage": True}
    assert request.headers["Accept"] == "text/event-stream"


def test_several_tool_calls_with_arguments_split_across_chunks(server: StreamServer) -> None:
    server.script(CHAT, Stream(openai_chunks(tool_calls=TWO_CALLS, usage=USAGE)))
    reply = call(agent(server))
    assert reply.tool_calls == [
        ToolCall(name="lookup", args={"city": "Paris"}, id="call_a"),
        ToolCall(name="convert", args={"amount": 12.5, "to": "EUR"}, id="call_b"),
    ]
    assert reply.finish_reason == "tool_calls"
    assert reply.problems == []
    history = reply.assistant_message()["tool_calls"]
    assert [c["function"]["arguments"] for c in history] == [
        '{"city": "Paris"}',
        '{"amount": 12.5, "to": "EUR"}',
    ]


def test_an_agent_that_answers_a_stream_request_whole_is_read_whole(server: StreamServer) -> None:
    server.script(CHAT, Reply(body=completion("not streamed", usage=USAGE)))
    reply = call(agent(server))
    assert reply.content == "not streamed"
    assert reply.call is not None and reply.call.first_token_ms is None


def test_a_streamed_error_chunk_fails_the_call(server: StreamServer) -> None:
    error = sse({"error": {"message": "model overloaded", "type": "server_error"}})
    server.script(CHAT, Stream([*openai_chunks(["par"], done=False)[:2], error]))
    caught = failure(agent(server))
    assert "model overloaded" in caught.message
    assert caught.partial is not None and caught.partial.content == "par"


# -- a stream that breaks ------------------------------------------------------------------


def test_a_stream_cut_mid_way_fails_keeping_what_came_and_is_not_retried(
    server: StreamServer,
) -> None:
    server.script(CHAT, Stream(openai_chunks(["The total ", "is"])[:3], end="cut"))
    caught = failure(agent(server, max_retries=3))
    assert caught.kind == "connection"
    assert "stream broke off" in caught.message
    assert caught.partial is not None and caught.partial.content == "The total is"
    assert caught.call is not None and caught.call.first_token_ms is not None
    assert len(server.requests(CHAT)) == 1


def test_a_stream_that_ends_before_done_is_cut_short(server: StreamServer) -> None:
    # Closed cleanly, but without its finish_reason and [DONE]: cut short all the same.
    server.script(CHAT, Stream(openai_chunks(["Half an ans"])[:2]))
    caught = failure(agent(server, max_retries=2))
    assert "ended before data: [DONE]" in caught.message
    assert caught.partial is not None and caught.partial.content == "Half an ans"
    assert len(server.requests(CHAT)) == 1


def test_garbage_in_the_stream_fails_keeping_what_came(server: StreamServer) -> None:
    good = openai_chunks(["Fine so far"])[:2]
    server.script(CHAT, Stream([*good, b"data: {this is not json\n\n"]))
    caught = failure(agent(server, max_retries=3))
    assert caught.kind == "stream"
    assert "not JSON" in caught.message and "{this is not json" in caught.message
    assert caught.partial is not None and caught.partial.content == "Fine so far"
    assert len(server.requests(CHAT)) == 1


def test_silence_past_the_timeout_fails_keeping_what_came(server: StreamServer) -> None:
    server.script(CHAT, Stream(openai_chunks(["Thinking"])[:2], end="hang"))
    started = time.monotonic()
    caught = failure(agent(server, timeout=0.3, max_retries=3))
    assert time.monotonic() - started < 2
    assert caught.kind == "timeout"
    assert "stream went silent for 0.3s" in caught.message
    assert caught.partial is not None and caught.partial.content == "Thinking"
    assert len(server.requests(CHAT)) == 1


def test_a_long_stream_that_keeps_coming_is_not_cut_by_the_timeout(server: StreamServer) -> None:
    # Each piece comes within the timeout; the whole takes longer than it.
    pieces = [Piece(p, delay=0.12) for p in openai_chunks(["a", "b", "c", "d"])]
    server.script(CHAT, Stream(pieces))
    reply = call(agent(server, timeout=0.3))
    assert reply.content == "abcd"
    assert reply.call is not None and reply.call.latency_ms >= 600


def test_retries_happen_only_before_the_first_byte_of_content(server: StreamServer) -> None:
    role_only = openai_chunks(["x"])[:1]  # the role chunk carries no content
    server.script(
        CHAT,
        Reply(503, body={"error": {"message": "busy"}}),
        Stream(role_only, end="cut"),
        Stream(openai_chunks(["second ", "try"], usage=USAGE)),
    )
    reply = call(agent(server, max_retries=3))
    assert reply.content == "second try"
    assert reply.call is not None and reply.call.attempts == 3
    assert len(server.requests(CHAT)) == 3


# -- http sse and ndjson agents -----------------------------------------------------------


def http_agent(server: StreamServer, framing: str, **response: Any) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "protocol": "http",
            "url": server.url("/chat"),
            "stream": framing,
            "timeout": 2,
            "base_delay": 0.01,
            "max_retries": 1,
            "response": {"content_delta": "$.delta.text", "final": "$.done", **response},
        }
    )


def test_an_http_sse_stream_reads_deltas_and_the_final_event(server: StreamServer) -> None:
    final = {"done": True, "needs_input": True, "state": {"step": 2}, "usage": USAGE}
    events = [sse({"delta": {"text": "Which "}}), sse({"delta": {"text": "city?"}}), sse(final)]
    server.script("/chat", Stream(events))
    reply = call(http_agent(server, "sse", awaiting_input="$.needs_input"), HttpAgentClient)
    assert reply.content == "Which city?"
    assert reply.awaiting_input is True
    assert reply.state == {"step": 2}
    assert reply.usage == Usage(prompt_tokens=12, completion_tokens=7, total_tokens=19)
    assert reply.call is not None and reply.call.first_token_ms is not None


def test_an_http_ndjson_stream_reads_tool_calls_from_the_final_event(server: StreamServer) -> None:
    lines = [
        b'{"delta": {"text": "Booking"}}\n',
        b'{"delta": {"text": " now"}}\n',
        json.dumps({"done": True, "calls": [{"name": "book", "args": {"id": 7}}]}).encode() + b"\n",
    ]
    server.script("/chat", Stream(lines, content_type="application/x-ndjson"))
    reply = call(http_agent(server, "ndjson", tool_calls="$.calls"), HttpAgentClient)
    assert reply.content == "Booking now"
    assert reply.tool_calls == [ToolCall(name="book", args={"id": 7})]
    assert server.requests("/chat")[0].headers["Accept"] == "application/x-ndjson"


def test_an_http_stream_that_ends_before_its_final_event_fails(server: StreamServer) -> None:
    server.script("/chat", Stream([sse({"delta": {"text": "Part"}})]))
    caught = failure(http_agent(server, "sse"), HttpAgentClient)
    assert "ended before its final event ($.done)" in caught.message
    assert caught.partial is not None and caught.partial.content == "Part"


def test_stream_settings_are_checked_per_protocol() -> None:
    with pytest.raises(ValueError, match="stream: sse or stream: ndjson"):
        AgentConfig.model_validate({"protocol": "http", "url": "http://x.test/", "stream": True})
    with pytest.raises(ValueError, match="stream: true"):
        AgentConfig.model_validate(
            {"protocol": "openai", "base_url": "http://x.test/", "stream": "sse"}
        )


# -- turns: time to first token, total time, the latency assertion, partial output -------


def streamed_case(
    *assertions: dict[str, Any], mocks: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": "S1",
        "input": "What is the weather?",
        "assertions": list(assertions),
        "tool_mocks": mocks or {},
    }


def test_a_streamed_turn_records_first_token_and_total_time(server: StreamServer) -> None:
    # The first call's first piece of content (a tool call) comes after 0.12 s; the
    # second call, after the mocked result, takes 0.15 s more.
    calls = openai_chunks(tool_calls=[("c1", "weather", ['{"city":', '"Oslo"}'])])
    slow_start = [Piece(p, delay=0.12 if i == 1 else 0.0) for i, p in enumerate(calls)]
    answer = [
        Piece(p, delay=0.15 if i == 1 else 0.0) for i, p in enumerate(openai_chunks(["Sunny", "."]))
    ]
    server.script(CHAT, Stream(slow_start), Stream(answer))
    config = project({"target": agent(server).model_dump()})
    case = streamed_case(
        {"type": "latency", "max_ms": 5000, "first_token_max_ms": 5000},
        {"type": "latency", "first_token_max_ms": 50},
        mocks={"weather": {"sky": "clear"}},
    )
    result, _ = run_case(case, config)
    [turn] = result.turns
    assert turn.output == "Sunny."
    assert turn.tool_calls == [ToolCall(name="weather", args={"city": "Oslo"}, id="c1")]
    assert turn.first_token_ms is not None and 120 <= turn.first_token_ms < 270
    assert turn.response_ms is not None and turn.response_ms >= 270
    passed, failed = turn.assertions
    assert passed.passed, passed.reason
    assert not failed.passed and "(at most 50 ms allowed)" in failed.reason
    # The mocked result went back to the target; both calls are recorded.
    assert server.bodies(CHAT)[1]["messages"][-1]["role"] == "tool"
    assert [c.stop_reason for c in turn.calls or []] == ["tool_calls", "stop"]
    record = json.loads(result.to_json_line())["turns"][0]
    assert record["first_token_ms"] == turn.first_token_ms
    assert record["calls"][0]["first_token_ms"] >= 0


def test_the_latency_assertion_passes_and_fails_on_the_reply_time(server: StreamServer) -> None:
    pieces = [Piece(p, delay=0.1) for p in openai_chunks(["slow", " reply"])]
    server.script(CHAT, Stream(pieces), Stream(pieces))
    config = project({"target": agent(server).model_dump()})
    fast, _ = run_case(streamed_case({"type": "latency", "max_ms": 100}), config)
    slow_ok, _ = run_case(streamed_case({"type": "latency", "max_ms": 5000}), config)
    assert fast.status == "failed"
    assert "reply took" in fast.turns[0].assertions[0].reason
    assert "(at most 100 ms allowed)" in fast.turns[0].assertions[0].reason
    assert slow_ok.status == "passed", slow_ok.turns[0].assertions[0].reason


def test_first_token_is_not_measured_on_a_reply_read_whole(server: StreamServer) -> None:
    server.script(CHAT, Reply(body=completion("whole")), Reply(body=completion("whole")))
    config = project({"target": agent(server, stream=False).model_dump()})
    total, _ = run_case(streamed_case({"type": "latency", "max_ms": 5000}), config)
    first, _ = run_case(streamed_case({"type": "latency", "first_token_max_ms": 5000}), config)
    assert total.status == "passed"
    assert total.turns[0].first_token_ms is None and total.turns[0].response_ms is None
    assert "first_token_ms" not in json.loads(total.to_json_line())["turns"][0]
    assert first.status == "failed"
    assert "was not streamed" in first.turns[0].assertions[0].reason


def test_a_broken_stream_fails_the_turn_keeping_its_partial_output(server: StreamServer) -> None:
    server.script(CHAT, Stream(openai_chunks(["Your total is 3"])[:2], end="hang"))
    config = project({"target": agent(server, timeout=0.3).model_dump()})
    result, _ = run_case(streamed_case({"type": "contains", "value": "total"}), config)
    [turn] = result.turns
    assert result.status == "failed"
    assert turn.output == "Your total is 3"
    assert turn.error is not None and "went silent" in turn.error
    assert turn.first_token_ms is not None
    assert len(server.requests(CHAT)) == 1
