"""Credentials written into agenttest.yaml itself (a password in a URL, a credential
header's literal value) are never stored, while the run still calls with them.

A small Chat Completions server checks both credentials on every call and records
what it was sent. Each run, embedded (SQLite) and on a one-worker fleet (Postgres),
must reach it with the real values; the store holds none of them. A worker that cannot
read agenttest.yaml at the path the run names fails the agent's conversations with a
reason that says to use ${VAR}.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fleet import Fleet, fleet_on, write_cases
from places import PLACES, Place

from agenttest_worker.agents import config_from_stored, load_config
from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer
from agenttest_worker.errors import ConfigError
from agenttest_worker.settings import get_settings

PASSWORD = f"pw-{secrets.token_hex(12)}"
KEY = f"key-{secrets.token_hex(12)}"


class CheckingAgent(ServedOnThread):
    """Chat Completions that answers only callers with bob's password, or the key."""

    path = "/v1"

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str | None]] = []
        self._server = ThreadedServer(self._app, name="checking-agent")

    async def _chat(self, request: web.Request) -> web.Response:
        auth, key = request.headers.get("Authorization"), request.headers.get("X-Api-Key")
        self.seen.append((auth, key))
        basic = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
        if auth != basic and key != KEY:
            return web.json_response({"error": {"message": "unauthorized"}}, status=401)
        body = await request.json()
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "let in"},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest) -> Place:
    return Place(request.param, request, worker="credentials", threads=2)


def _config(folder: Path, root: str) -> Path:
    quick = {"protocol": "openai", "model": "m", "max_retries": 0}
    userinfo = f"{root[:7]}bob:{PASSWORD}@{root[7:]}"
    agents: dict[str, Any] = {
        "basic": {**quick, "base_url": userinfo},
        "keyed": {**quick, "base_url": root, "headers": {"X-Api-Key": KEY, "X-Team": "blue"}},
    }
    path = folder / "agenttest.yaml"
    path.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return path


def _store_text(place: Place) -> str:
    if place.fleet is not None:
        done = subprocess.run(
            ["pg_dump", "--data-only", "--inserts", place.fleet.database_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout
    path = get_settings().effective_database_url().removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return "\n".join(conn.iterdump())


def test_literal_credentials_are_used_and_never_stored(place: Place, tmp_path: Path) -> None:
    with CheckingAgent() as agent:
        config = _config(tmp_path, agent.start())
        case = {"id": "c1", "input": "open", "assertions": [{"type": "contains", "value": "let"}]}
        cases = write_cases(tmp_path, [case])
        for name in ("basic", "keyed"):
            code, out, err = place.submit(["-i", str(cases), "-n", name, "--config", str(config)])
            assert code == 0, out + err
        assert len(agent.seen) == 2
        stored = _store_text(place)
        assert PASSWORD not in stored and KEY not in stored
        # What is not a credential is stored as written; the masked ones show as masked.
        assert "X-Team" in stored and "blue" in stored and "***" in stored


def test_a_process_without_the_file_says_to_use_an_environment_variable(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, "http://127.0.0.1:9"))
    stored = config.stored()
    assert PASSWORD not in json.dumps(stored) and KEY not in json.dumps(stored)
    # The file at the stored path gives the credentials back.
    again = config_from_stored(stored)
    assert PASSWORD in str(again.agent("basic").base_url)
    assert again.agent("keyed").headers["X-Api-Key"] == KEY
    # A worker without that file (or with another) cannot call those agents, and says why.
    Path(str(stored["path"])).write_text(json.dumps({"agents": {}}), encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        config_from_stored(stored)
    fields = {p.field for p in raised.value.problems}
    assert fields == {"agents.basic", "agents.keyed"}
    assert "write it as ${VAR}" in str(raised.value.problems[0])
