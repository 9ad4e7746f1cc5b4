"""The spec's context.Options on the wire: `skip`, `search` and `mode` of a case (merged
case < turn) reach the target beside `metadata`, as `options`, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agent_servers import AgentServer
from agent_servers import Reply as ServerReply
from scripted_agent import ScriptedAgent, project, run_case

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
    result, _ = run_case(CASE, project({"target": agent.entry("target")}))
    assert result.status == "passed", result
    first, second = agent.requests("target")
    assert first["options"] == FIRST
    assert first["metadata"] == {"locale": "fr"}
    assert second["options"] == SECOND
    assert second["metadata"] == {"locale": "fr", "step": 2}


def test_openai_sends_no_options_when_the_case_sets_none(agent: ScriptedAgent) -> None:
    agent.script("target", ["One."])
    case = {"id": "P", "input": "hi", "options": {"metadata": {"a": "b"}, "connector": "x"}}
    run_case(case, project({"target": agent.entry("target")}))
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
