"""A redirect that leaves the agent's origin (scheme, host, port) never carries a
credential there: not the API key whichever header carries it (`Authorization`,
Anthropic's `x-api-key`, Azure-style `api-key`), not a `Cookie`, not a header whose value
agenttest.yaml takes from `${VAR}`. Headers that are not secret go on, and a redirect
within the origin keeps them all. One server answers `307` to a second on 127.0.0.2,
which records what it received."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from agent_servers import run
from aiohttp import web
from stream_servers import anthropic_message

from agenttest_worker.agents.config_loading import config_from_data
from agenttest_worker.agents.http.exchange import close_session
from agenttest_worker.agents.interface import AgentReply, AgentRequest
from agenttest_worker.agents.protocols.anthropic import AnthropicClient
from agenttest_worker.agents.protocols.http import HttpAgentClient
from agenttest_worker.agents.protocols.openai import OpenAIClient

KEY = "sk-redirect-test-key"
TOKEN = "tenant-token-from-env"
ENV = {"REDIRECT_TEST_KEY": KEY, "REDIRECT_TEST_TOKEN": TOKEN}
SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "cookie", "x-tenant-token"}

CLIENTS = {"openai": OpenAIClient, "anthropic": AnthropicClient, "http": HttpAgentClient}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "http": "/chat"}
BODIES: dict[str, Any] = {
    "openai": {"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
    "anthropic": anthropic_message("hi"),
    "http": {"content": "hi"},
}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIRECT_TEST_KEY", KEY)  # (read at call time, from the environment)


@asynccontextmanager
async def serving(host: str, handler: Any) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def entry(protocol: str, root: str) -> dict[str, Any]:
    headers = {
        "X-Tenant-Token": "${REDIRECT_TEST_TOKEN}",
        "Cookie": "session=abc",
        "api-key": "${REDIRECT_TEST_KEY}",
        "X-Trace": "plain",
    }
    found: dict[str, Any] = {
        "protocol": protocol,
        "headers": headers,
        "api_key_env": "REDIRECT_TEST_KEY",
        "max_retries": 0,
        "timeout": 5,
    }
    if protocol == "http":
        found["url"] = root + PATHS["http"]
    else:
        found |= {"base_url": root + "/v1", "model": "m"}
    return found


async def say_hi(protocol: str, root: str) -> AgentReply:
    """One call of agent `a` (its entry for `protocol`, at `root`) saying "Hi"."""
    project = config_from_data({"agents": {"a": entry(protocol, root)}}, None, ENV)
    client = CLIENTS[protocol]("a", project.agents["a"], project)
    messages = [{"role": "user", "content": "Hi"}]
    return await client.complete(AgentRequest(role="target", messages=messages))


@pytest.mark.parametrize("protocol", ["openai", "anthropic", "http"])
def test_a_redirect_to_another_origin_carries_no_credential(protocol: str) -> None:
    received: list[dict[str, str]] = []

    async def elsewhere(request: web.Request) -> web.StreamResponse:
        received.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response(BODIES[protocol])

    async def main() -> AgentReply:
        try:
            async with serving("127.0.0.2", elsewhere) as other:

                async def first(request: web.Request) -> web.StreamResponse:
                    raise web.HTTPTemporaryRedirect(other + request.path_qs)

                async with serving("127.0.0.1", first) as root:
                    return await say_hi(protocol, root)
        finally:
            await close_session()

    reply = run(main())
    assert reply.content == "hi"
    [seen] = received
    assert not SECRET_HEADERS & set(seen), seen
    assert not any(KEY in v or TOKEN in v for v in seen.values()), seen
    assert seen["x-trace"] == "plain" and seen["content-type"] == "application/json"
    if protocol == "anthropic":
        assert "anthropic-version" in seen


@pytest.mark.parametrize("protocol", ["openai", "anthropic", "http"])
def test_a_redirect_within_the_origin_keeps_every_header(protocol: str) -> None:
    received: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/moved"):
            received.append({k.lower(): v for k, v in request.headers.items()})
            return web.json_response(BODIES[protocol])
        raise web.HTTPTemporaryRedirect("/moved" + request.path_qs)

    async def main() -> AgentReply:
        try:
            async with serving("127.0.0.1", answer) as root:
                return await say_hi(protocol, root)
        finally:
            await close_session()

    reply = run(main())
    assert reply.content == "hi"
    [seen] = received
    assert seen["x-tenant-token"] == TOKEN and seen["api-key"] == KEY
    assert seen["cookie"] == "session=abc" and seen["x-trace"] == "plain"
    key_header = "x-api-key" if protocol == "anthropic" else "authorization"
    assert KEY in seen[key_header]
