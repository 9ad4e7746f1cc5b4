"""A secret written into an agent's URL never shows: not in the store, the broker, the
logs or any report.

Users put secrets in URLs two ways: a password in the userinfo
(`base_url: http://bob:${PASS}@host/v1`) and a query parameter
(`url: https://host/chat?key=${API_KEY}`). The agents here are unreachable three ways,
each of which puts the URL, or part of it, into the error text:
- nothing listens on the port (connection refused);
- a gateway in front of a dead agent answers 502 with a page naming what it could not
  reach, the path and query as requested (as nginx, Squid and most ingresses do);
- a gateway answers every request with a redirect to itself (aiohttp's "too many
  redirects" error names the URL).
After a run on a fleet and one embedded, both into this test's Postgres database, the
test looks for the secrets in a `pg_dump` of that database, every key and value of the
test's Redis db, the workers' logs, the submitters' `-v` output and the reports of both
runs in every format.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_servers import refused_url
from aiohttp import web
from fault_kit import write_config
from fleet import Fleet, fleet_on, run_id_of, write_cases

from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer
from agenttest_worker.report import REPORTERS

pytestmark = pytest.mark.fleet

PASS_ENV = "URL_TEST_PASS"
KEY_ENV = "URL_TEST_KEY"
FORMATS = ("console", "json", "jsonl", "table", "tsv", "junit")


class Gateway(ServedOnThread):
    """A gateway to a dead agent: 502 naming the path and query it could not reach, or,
    under /loop, a redirect to the very same URL."""

    def __init__(self) -> None:
        self._server = ThreadedServer(self._app, name="dead-gateway", shutdown_timeout=1.0)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/loop"):
            raise web.HTTPTemporaryRedirect(request.path_qs)
        page = f"502 Bad Gateway: no upstream answered for {request.method} {request.path_qs}"
        return web.Response(status=502, text=page)

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app


def _agents(dead: str, gateway: str) -> dict[str, dict[str, Any]]:
    """Each way to be unreachable, with a secret in the userinfo and in the query."""
    userinfo = f"bob:${{{PASS_ENV}}}@"
    quick = {"max_retries": 1, "base_delay": 0.01, "timeout": 5}

    def openai(root: str) -> dict[str, Any]:
        return {"protocol": "openai", "base_url": f"{root[:7]}{userinfo}{root[7:]}/v1", **quick}

    def http(url: str) -> dict[str, Any]:
        return {"protocol": "http", "url": url, **quick}

    return {
        "dead.userinfo": openai(dead),
        # A key-like name, and beside it a parameter whose value is the user's to see.
        "dead.query": http(f"{dead}/chat?key=${{{KEY_ENV}}}&api-version=2024-06-01"),
        "gateway.userinfo": openai(gateway),
        # A name that says nothing: hidden because its value comes from the environment.
        "gateway.query": http(f"{gateway}/chat?tenant=${{{KEY_ENV}}}&api-version=2024-06-01"),
        "loop.userinfo": openai(f"{gateway}/loop"),
        "loop.query": http(f"{gateway}/loop/chat?token=${{{KEY_ENV}}}"),
    }


def _dump_redis(url: str) -> str:
    """Every key of the db and its value, whatever its type."""
    client = redis.Redis.from_url(url)
    lines: list[str] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        value: Any
        if kind == "string":
            value = client.get(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "set":
            value = client.smembers(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = kind
        lines.append(f"{key!r}: {value!r}")
    return "\n".join(lines)


def _pg_dump(url: str) -> str:
    done = subprocess.run(
        ["pg_dump", "--data-only", "--inserts", url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_secrets_in_agent_urls_never_show(
    fleet: Fleet, redis_db: str, pg_database: str, tmp_path: Path
) -> None:
    password, key = f"pw{secrets.token_hex(12)}", f"k{secrets.token_hex(12)}"
    fleet.env.update({PASS_ENV: password, KEY_ENV: key})
    with Gateway() as gateway:
        agents = _agents(refused_url(), gateway.base_url)
        config = write_config(tmp_path, agents)
        cases = write_cases(
            tmp_path,
            [{"id": f"U-{name}", "input": "hello", "agent": name} for name in agents],
        )
        args = ["-i", str(cases), "-n", "dead.query", "--config", str(config), "-v"]
        fleet.start("w", concurrency=2)
        ran = fleet.submit([*args, "-o", str(tmp_path / "fleet.jsonl")])
        assert ran.returncode == 1, ran.stderr
        run_id = run_id_of(ran.stderr)
        # The same cases embedded (no broker), stored in the same database.
        embedded_env = {k: v for k, v in fleet.env.items() if k != "AGENTTEST_BROKER_URL"}
        embedded = subprocess.run(
            [sys.executable, "-m", "agenttest_submit.cli", *args],
            env={**embedded_env, "AGENTTEST_HOME": str(tmp_path / "embedded-home")},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert embedded.returncode == 1, embedded.stderr

    assert set(FORMATS) <= set(REPORTERS)
    reports: dict[str, str] = {}
    for ref in (run_id, "last"):  # `last`: the embedded run
        for fmt in REPORTERS:
            shown = fleet.submit(["report", ref, "--format", fmt, "-v"])
            assert shown.returncode == 1, shown.stderr
            reports[f"report {ref} --format {fmt}"] = shown.stdout + shown.stderr

    # Every case failed on its agent, with an error saying how.
    records = [json.loads(line) for line in reports[f"report {run_id} --format jsonl"].split("\n")
               if line.startswith("{")]  # fmt: skip
    errors = {r["id"]: r["turns"][0]["error"] for r in records}
    assert set(errors) == {f"U-{name}" for name in agents}
    assert all(r["status"] == "failed" for r in records)
    assert "cannot reach" in errors["U-dead.query"]
    assert "HTTP 502" in errors["U-gateway.query"]
    # The gateway's page is kept, with the secret masked and the rest of the URL shown.
    assert "tenant=***&api-version=2024-06-01" in errors["U-gateway.query"]
    assert "redirect" in errors["U-loop.query"].lower()

    places = {
        "pg_dump": _pg_dump(pg_database),
        "redis": _dump_redis(redis_db),
        "worker logs": fleet.logs(),
        "fleet submitter -v": ran.stdout + ran.stderr,
        "fleet -o": (tmp_path / "fleet.jsonl").read_text(),
        "embedded submitter -v": embedded.stdout + embedded.stderr,
        **reports,
    }
    assert run_id in places["pg_dump"] and "U-gateway.query" in places["pg_dump"]
    for secret in (password, key):
        leaks = [name for name, text in places.items() if secret in text]
        assert not leaks, f"a secret ({secret[:4]}…) leaked into: {leaks}"
