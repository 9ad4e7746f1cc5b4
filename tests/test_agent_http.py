"""The generic http protocol over real HTTP: request templates and reply mappings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from agent_servers import AgentServer, Reply, run, tool_call

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.protocols.http import HttpAgentClient
from agenttest_worker.results import AgentRole, ToolCall, Usage

PATH = "/chat"
IMAGE = "data:image/png;base64,iVBORw0KGgo="
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "I want to submit an expense"},
    {"role": "assistant", "content": "What type of expense?"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Business travel, "},
            {"type": "text", "text": "see receipt"},
            {"type": "image_url", "image_url": {"url": IMAGE}},
            {
                "type": "file",
                "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "r.pdf"},
            },
        ],
    },
]


@pytest.fixture
def server() -> Iterator[AgentServer]:
    with AgentServer() as running:
        yield running


def agent(server: AgentServer, **fields: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "protocol": "http",
        "url": server.url(PATH),
        "timeout": 5,
        "base_delay": 0.01,
        **fields,
    }
    return AgentConfig.model_validate(settings)


def call(
    config: AgentConfig,
    *,
    messages: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
    role: AgentRole = "target",
) -> AgentReply:
    request = AgentRequest(
        role=role,
        messages=messages if messages is not None else HISTORY,
        metadata=metadata if metadata is not None else {"locale": "fr", "n": 2},
        session_id="sess-1",
        case_id="T002",
        turn=3,
    )
    return run(HttpAgentClient("support.bot", config).complete(request))


def reply_to(server: AgentServer, body: Any, **fields: Any) -> AgentReply:
    server.script(PATH, Reply(body=body))
    return call(agent(server, **fields))


# -- the request ---------------------------------------------------------------------------


def test_default_body_shape(server: AgentServer) -> None:
    server.script(PATH, Reply(body={"content": "ok"}))
    call(agent(server))
    [request] = server.requests(PATH)
    assert request.method == "POST"
    assert request.json == {
        "input": "Business travel, see receipt",
        "messages": HISTORY,
        "metadata": {"locale": "fr", "n": 2},
        "session_id": "sess-1",
        "attachments": [
            {"type": "image", "source": IMAGE},
            {"type": "file", "source": "data:application/pdf;base64,JVBE", "name": "r.pdf"},
        ],
    }


def test_template_whole_value_and_inline_placeholders(server: AgentServer) -> None:
    template = {
        "message": "{{input}}",
        "history": "{{messages}}",
        "meta": "{{metadata}}",
        "session": "{{ session_id }}",
        "turn": "{{turn}}",
        "label": "case {{case_id}} turn {{turn}} as {{role}}",
        "inline_object": "meta={{metadata}}",
        "unknown": "{{nope}} stays",
        "nested": [{"deep": " {{input}} "}, "{{attachments}}", 7, None, True],
    }
    server.script(PATH, Reply(body={"content": "ok"}))
    call(agent(server, request=template), role="simulator")
    body = server.bodies(PATH)[0]
    assert body == {
        "message": "Business travel, see receipt",
        "history": HISTORY,
        "meta": {"locale": "fr", "n": 2},
        "session": "sess-1",
        "turn": 3,
        "label": "case T002 turn 3 as simulator",
        "inline_object": 'meta={"locale": "fr", "n": 2}',
        "unknown": "{{nope}} stays",
        "nested": [
            {"deep": "Business travel, see receipt"},
            [
                {"type": "image", "source": IMAGE},
                {"type": "file", "source": "data:application/pdf;base64,JVBE", "name": "r.pdf"},
            ],
            7,
            None,
            True,
        ],
    }


def test_input_is_the_last_user_message(server: AgentServer) -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "tool", "content": "{}", "tool_call_id": "c"},
    ]
    server.script(PATH, Reply(body={"content": "ok"}))
    call(agent(server, request={"q": "{{input}}", "files": "{{attachments}}"}), messages=messages)
    assert server.bodies(PATH)[0] == {"q": "first", "files": []}


def test_method_put_and_headers(server: AgentServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPPORT_KEY", "k-1")
    server.script(PATH, Reply(body={"content": "ok"}))
    call(agent(server, method="PUT", headers={"X-Tenant": "acme"}, api_key_env="SUPPORT_KEY"))
    [request] = server.requests(PATH)
    assert request.method == "PUT"
    assert request.headers["X-Tenant"] == "acme"
    assert request.headers["Authorization"] == "Bearer k-1"


def test_metadata_none_sends_an_empty_object(server: AgentServer) -> None:
    server.script(PATH, Reply(body={"content": "ok"}))
    call(agent(server, metadata="none"), metadata={"secret_plan": "x"})
    assert server.bodies(PATH)[0]["metadata"] == {}


# -- the reply -------------------------------------------------------------------------------


def test_explicit_shape_needs_no_mapping(server: AgentServer) -> None:
    reply = reply_to(
        server,
        {
            "content": "Please provide PO number.",
            "awaiting_input": True,
            "input_hint": "PO number",
            "tool_calls": [{"name": "lookup", "args": {"q": "po"}}],
            "state": {"expense": {"status": "draft"}},
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "cost": 0.01},
        },
    )
    assert reply.content == "Please provide PO number."
    assert reply.awaiting_input is True
    assert reply.input_hint == "PO number"
    assert reply.tool_calls == [ToolCall(name="lookup", args={"q": "po"})]
    assert reply.state == {"expense": {"status": "draft"}}
    assert reply.usage == Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    assert reply.finish_reason is None
    assert reply.call is not None
    assert reply.call.usage == reply.usage and reply.call.status_code == 200


def test_usage_without_a_total_counts_the_sum(server: AgentServer) -> None:
    reply = reply_to(
        server, {"content": "ok", "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    )
    assert reply.usage == Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7)
    given = reply_to(
        server,
        {"content": "ok", "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 9}},
    )
    assert given.usage == Usage(prompt_tokens=5, completion_tokens=2, total_tokens=9)


@pytest.mark.parametrize("flag", [True, "true", "TRUE", False, "false"])
def test_response_mapping_with_jsonpaths(server: AgentServer, flag: Any) -> None:
    mapping = {
        "content": "$.data.reply.text",
        "tool_calls": "$.data.calls",
        "awaiting_input": "$.needs_input",
        "input_hint": "$.hint",
        "state": "$.session.state",
    }
    body = {
        "data": {
            "reply": {"text": "Which cost centre?"},
            "calls": [tool_call("ask_user", {"field": "cost_centre"}, "c9")],
        },
        "needs_input": flag,
        "hint": "cost centre",
        "session": {"state": {"step": 2}},
        "content": "not this one",
    }
    reply = reply_to(server, body, response=mapping)
    assert reply.content == "Which cost centre?"
    assert reply.tool_calls == [ToolCall(name="ask_user", args={"field": "cost_centre"}, id="c9")]
    assert reply.awaiting_input is (flag in (True, "true", "TRUE"))
    assert reply.input_hint == "cost centre"
    assert reply.state == {"step": 2}


def test_unrecognised_awaiting_value_is_not_a_declaration(server: AgentServer) -> None:
    reply = reply_to(server, {"content": "hi", "awaiting_input": "maybe"})
    assert reply.awaiting_input is None


@pytest.mark.parametrize("key", ["output", "reply", "response", "message", "text", "answer"])
def test_content_fallbacks(server: AgentServer, key: str) -> None:
    assert reply_to(server, {key: "found it", "other": 1}).content == "found it"


def test_fallbacks_only_for_the_default_content_path(server: AgentServer) -> None:
    reply = reply_to(server, {"output": "not mapped"}, response={"content": "$.result"})
    assert reply.content is None


def test_fallback_order_prefers_output(server: AgentServer) -> None:
    assert reply_to(server, {"answer": "later", "output": "first"}).content == "first"


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ({"status": "ok", "city": "Zürich"}, '{"status": "ok", "city": "Zürich"}'),
        (["a", "b"], '["a", "b"]'),
        (42, "42"),
        (True, "true"),
        ([{"type": "text", "text": "part "}, {"type": "text", "text": "two"}], "part two"),
    ],
)
def test_non_string_content_becomes_text(server: AgentServer, content: Any, text: str) -> None:
    reply = reply_to(server, {"content": content})
    assert reply.content == text
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        assert json.loads(text) == content


def test_a_json_string_body_is_the_content(server: AgentServer) -> None:
    server.script(PATH, Reply(body=b'"just text"', content_type="application/json"))
    assert call(agent(server)).content == "just text"


@pytest.mark.parametrize("size", [300_000, 5_000_000])
def test_a_large_reply_is_read_whole(server: AgentServer, size: int) -> None:
    """The body arrives over many reads: all of it is the reply, not its first part."""
    text = "x" * size
    server.script(PATH, Reply(body={"content": text}))
    assert call(agent(server)).content == text


def test_a_non_json_body_is_a_parse_error(server: AgentServer) -> None:
    server.always(PATH, Reply(body="Internal proxy page", content_type="text/plain"))
    with pytest.raises(AgentError) as caught:
        call(agent(server))
    assert caught.value.kind == "parse"
    assert "support.bot replied with text/plain, not JSON" in caught.value.message
    assert '"Internal proxy page"' in caught.value.message
    assert len(server.requests(PATH)) == 1
