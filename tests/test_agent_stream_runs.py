"""Streamed turns in whole runs, embedded and on a fleet: what the records keep of them
(time to first token, total time, stop reasons) and what they never keep (the API key).

The targets are a streaming Anthropic agent and a streaming Chat Completions agent
(tests/stream_servers.py); the key travels in `x-api-key` from `api_key_env`, and after
the run it is looked for in the store, the JSONL output and what the processes printed.
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet import Fleet, fleet_on
from stream_servers import Piece, Stream, StreamServer, anthropic_events, openai_chunks

from agenttest_submit.cli.main import main

KEY_ENV = "AGENTTEST_TEST_STREAM_KEY"
PLACES = ["embedded", pytest.param("fleet", marks=pytest.mark.fleet)]


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _slow_first(pieces: list[bytes], delay: float) -> list[Piece | bytes]:
    """The stream with its second piece (the first content) after `delay` seconds."""
    return [Piece(p, delay=delay) if i == 1 else p for i, p in enumerate(pieces)]


def _project(path: Path, server: StreamServer) -> Path:
    common = {"api_key_env": KEY_ENV, "stream": True, "timeout": 5, "max_retries": 0}
    agents = {
        "claude": {"protocol": "anthropic", "base_url": server.url(), "model": "c", **common},
        "gpt": {"protocol": "openai", "base_url": server.url("/v1"), "model": "g", **common},
    }
    path.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return path


def _case(case_id: str, agent: str, text: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "agent": agent,
        "input": f"Say something [{case_id}]",
        "assertions": [
            {"type": "contains", "value": text},
            {"type": "latency", "max_ms": 4000, "first_token_max_ms": 3000},
        ],
    }


def _dump(home: Path) -> str:
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
def test_streamed_turns_are_timed_in_the_records_and_the_key_is_never_kept(
    where: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = f"sk-ant-{secrets.token_hex(12)}"
    with StreamServer() as server:
        server.script(
            "/v1/messages", Stream(_slow_first(anthropic_events(["Hello ", "from Claude"]), 0.1))
        )
        server.script(
            "/v1/chat/completions", Stream(_slow_first(openai_chunks(["Hello ", "from GPT"]), 0.1))
        )
        config = _project(tmp_path / "agenttest.yaml", server)
        cases = tmp_path / "cases.jsonl"
        lines = [_case("C1", "claude", "from Claude"), _case("G1", "gpt", "from GPT")]
        cases.write_text("".join(json.dumps(c) + "\n" for c in lines), encoding="utf-8")
        out = tmp_path / "out.jsonl"
        args = ["-i", str(cases), "--config", str(config), "-o", str(out), "-v"]
        if where == "fleet":
            running: Fleet = request.getfixturevalue("fleet")
            running.env[KEY_ENV] = key  # every process of the fleet gets it, as users pass it
            running.start("stream", concurrency=2)
            done = running.submit(args)
            code, printed = done.returncode, done.stdout + done.stderr + running.logs()
            stored = _dump_postgres(running.database_url)
        else:
            monkeypatch.setenv(KEY_ENV, key)
            code = main(args)
            captured = capsys.readouterr()
            printed = captured.out + captured.err
            stored = _dump(tmp_path / ".agenttest")
        seen = server.requests()

    assert code == 0, printed
    assert [r.headers.get("x-api-key") for r in seen if r.path == "/v1/messages"] == [key]
    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    for case_id, reason in (("C1", "end_turn"), ("G1", "stop")):
        [turn] = records[case_id]["turns"]
        assert turn["status"] == "passed", turn
        assert 100 <= turn["first_token_ms"] <= turn["response_ms"]
        [call] = turn["calls"]
        assert call["stop_reason"] == reason
        assert call["first_token_ms"] >= 100
    assert "first token after" in records["C1"]["turns"][0]["assertions"][1]["reason"]
    # The console's turn line says when the first token came.
    shown = re.findall(
        r"Turn 1: .* → PASSED \(\d+(?:\.\d+)?m?s, first token \d+(?:\.\d+)?m?s\)", printed
    )
    assert len(shown) == 2, printed
    for place, text in {"store": stored, "output": out.read_text(), "printed": printed}.items():
        assert key not in text, f"the API key reached the {place}"
    assert stored, "nothing was stored"
