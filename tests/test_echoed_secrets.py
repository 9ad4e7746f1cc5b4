"""A hostile agent echoes its secrets back: they are masked wherever they would be kept.

The agents' entries take secrets from the environment as users pass them: a header
(`X-Api-Key: ${HDR_SECRET}`), a query value of the URL, a value of an http agent's
request template and of its `params`, a header of its history's requests. The agent (a
raw-socket server) sends the header's value back in a 401's body, in a 200 reply's
content, tool call and state, in a streamed reply (split across two pieces), in a stream
cut short (what arrived is kept on the error), and as a judge in its verdict's reason;
the http agent echoes its whole request, and a history-based agent keeps the headers of
its history's requests in that history.
After a run (embedded, and on a fleet) the secrets are looked for in what the run printed,
the JSONL, the HTML report, every file of the embedded store (the Postgres rows and the
workers' logs on a fleet): absent, with `***` where the agent wrote them.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet import Fleet, fleet_on
from raw_http import Answer, RawRequest, ThreadedRawServer, reply

from agenttest_submit.cli.main import main

PLACES = ["embedded", pytest.param("fleet", marks=pytest.mark.fleet)]
ENV_NAMES = ("HDR_SECRET", "URL_SECRET", "BODY_SECRET", "PARAM_SECRET", "HIST_SECRET")


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _completion(message: dict[str, Any], finish: str, **extra: Any) -> bytes:
    body = {
        "id": "chatcmpl-echo",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "echo",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        **extra,
    }
    return json.dumps(body).encode()


def _events(pieces: list[str], *, complete: bool) -> Answer:
    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": "chatcmpl-echo",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "echo",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    body = [event({"role": "assistant", "content": ""})]
    body += [event({"content": piece}) for piece in pieces]
    if complete:
        body += [event({}, "stop"), b"data: [DONE]\n\n"]
    return Answer([head, *body], close=True)


def _echo(request: RawRequest) -> Answer:
    """Every answer sends back what the agent was sent."""
    key = request.header("X-Api-Key") or ""
    if request.target.startswith("/hchat"):
        return reply(body=b'{"content": "noted"}')
    if request.target.startswith("/history"):
        # The history keeps what its requests carried, as a careless one might.
        said = f"history key {request.header('X-History-Key')}"
        events = [
            {"role": "user", "content": "Hello [EHIST]"},
            {"role": "assistant", "content": said},
            {"role": "assistant", "tool_calls": [{"name": "peek", "args": {"k": key}}]},
        ]
        return reply(body=json.dumps({"messages": events}).encode())
    if request.target.startswith("/http"):
        said = f"I was called at {request.target} with {request.body.decode()}"
        return reply(body=json.dumps({"content": said}).encode())
    body = json.loads(request.body)
    if body.get("model") == "judge":
        verdict = {"passed": False, "reason": f"the agent's key is {key}"}
        message = {"role": "assistant", "content": json.dumps(verdict)}
        return reply(body=_completion(message, "stop"))
    said = json.dumps(body["messages"])
    if "[E401]" in said:
        return reply(401, f"bad key: {key}".encode(), {"Content-Type": "text/plain"})
    if "[ESTREAM]" in said:
        return _events(["Your key is ", key[:7], key[7:], "."], complete=True)
    if "[ECUT]" in said:
        return _events(["Your key is ", key[:7], key[7:]], complete=False)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"key": key})},
    }
    message = {"role": "assistant", "content": f"Your key is {key}.", "tool_calls": [call]}
    return reply(body=_completion(message, "tool_calls", state={"seen": key}))


def _project(path: Path, server: ThreadedRawServer) -> Path:
    common = {"headers": {"X-Api-Key": "${HDR_SECRET}"}, "max_retries": 0, "timeout": 10}
    agents = {
        "echo": {"protocol": "openai", "base_url": server.url("/v1"), "model": "echo", **common},
        "echo.stream": {
            "protocol": "openai",
            "base_url": server.url("/v1"),
            "model": "echo",
            "stream": True,
            **common,
        },
        "echo.http": {
            "protocol": "http",
            "url": server.url("/http?tenant=${URL_SECRET}"),
            "request": {"input": "{{input}}", "auth": "${BODY_SECRET}", "params": "{{params}}"},
            "params": {"signature": "${PARAM_SECRET}"},
            **common,
        },
        "echo.history": {
            "protocol": "http",
            "url": server.url("/hchat"),
            "history": {
                "url": server.url("/history?session={{session_id}}"),
                "headers": {"X-History-Key": "${HIST_SECRET}"},
            },
            **common,
        },
        "judge": {"protocol": "openai", "base_url": server.url("/v1"), "model": "judge", **common},
    }
    path.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return path


def _cases(path: Path) -> Path:
    judged = {"type": "agent", "use": "agents:judge", "options": {"metadata": {"criteria": "x"}}}
    cases = [
        {"id": "E401", "agent": "echo", "input": "Hello [E401]"},
        {"id": "E200", "agent": "echo", "input": "Hello [E200]", "assertions": [judged]},
        {"id": "ESTREAM", "agent": "echo.stream", "input": "Hello [ESTREAM]"},
        {"id": "ECUT", "agent": "echo.stream", "input": "Hello [ECUT]"},
        {"id": "EHTTP", "agent": "echo.http", "input": "Hello [EHTTP]"},
        {"id": "EHIST", "agent": "echo.history", "input": "Hello [EHIST]"},
    ]
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def _dump_files(home: Path) -> str:
    parts = []
    for path in sorted(p for p in home.rglob("*") if p.is_file()):
        parts.append(path.read_bytes().decode("utf-8", errors="replace"))
        if path.suffix == ".db":
            with sqlite3.connect(path) as conn:
                parts += list(conn.iterdump())
    return "\n".join(parts)


def _dump_postgres(url: str) -> str:
    with psycopg.connect(url) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        ]
        return "\n".join(
            str(row[0])
            for table in tables
            for row in conn.execute(f'SELECT t::text FROM "{table}" t').fetchall()
        )


@pytest.mark.parametrize("where", PLACES)
def test_secrets_an_agent_echoes_are_masked_wherever_they_are_kept(
    where: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = {name: f"{name.lower()}-{secrets.token_hex(8)}" for name in ENV_NAMES}
    hdr = values["HDR_SECRET"]
    out, html = tmp_path / "results.jsonl", tmp_path / "report.html"
    with ThreadedRawServer(_echo) as server:
        config = _project(tmp_path / "agenttest.yaml", server)
        cases = _cases(tmp_path / "cases.jsonl")
        args = ["-i", str(cases), "--config", str(config), "-o", str(out), "-v"]
        report = ["report", "last", "--format", "html", "-o", str(html)]
        if where == "fleet":
            running: Fleet = request.getfixturevalue("fleet")
            running.env.update(values)  # every process of the fleet gets them, as users pass them
            running.start("echo", concurrency=2)
            done = running.submit(args)
            shown = running.submit(report)
            code = done.returncode
            printed = done.stdout + done.stderr + shown.stdout + shown.stderr
            printed += running.logs()
            stored = _dump_postgres(running.database_url)
        else:
            for name, value in values.items():
                monkeypatch.setenv(name, value)
            code = main(args)
            assert main(report) == 1  # (its exit code is the run's)
            captured = capsys.readouterr()
            printed = captured.out + captured.err
            stored = _dump_files(tmp_path / ".agenttest")
        received = list(server.server.requests)

    assert code == 1, printed  # the judge fails E200, the agent fails E401 and ECUT
    # The agent was sent every secret, so that it could echo them.
    assert {r.header("X-Api-Key") for r in received} == {hdr}
    [http_call] = [r for r in received if r.target.startswith("/http")]
    assert values["URL_SECRET"] in http_call.target
    sent = http_call.body.decode()
    assert values["BODY_SECRET"] in sent and values["PARAM_SECRET"] in sent

    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert records["E401"]["turns"][0]["calls"][0]["error"].endswith('bad key: ***"')
    e200 = records["E200"]["turns"][0]
    assert e200["output"] == "Your key is ***."
    assert e200["tool_calls"] == [{"name": "lookup", "args": {"key": "***"}, "id": "call_1"}]
    assert e200["assertions"][0]["reason"] == "the agent's key is ***"
    assert records["ESTREAM"]["turns"][0]["output"] == "Your key is ***."
    assert records["ECUT"]["turns"][0]["output"] == "Your key is ***"  # kept on the error
    echoed = records["EHTTP"]["turns"][0]["output"]
    ehist = records["EHIST"]["turns"][0]
    assert ehist["output"] == "history key ***"
    assert ehist["tool_calls"] == [{"name": "peek", "args": {"k": "***"}}]
    assert "tenant=***" in echoed and '"auth":"***"' in echoed and '"signature":"***"' in echoed

    kept = {
        "printed": printed,
        "JSONL": out.read_text(encoding="utf-8"),
        "HTML": html.read_text(encoding="utf-8"),
        "store": stored,
    }
    assert stored and "Your key is ***" in kept["HTML"]
    for place, text in kept.items():
        for name, value in values.items():
            assert value not in text, f"{name} reached the {place}"
