"""API keys never leave the process that makes the call (DESIGN.md: "Secrets never reach
the database, the reports or the logs").

Two secrets travel the way users pass them: an API key named by `api_key_env` and a
header interpolated from the environment (`X-Tenant: ${VAR}`), for the target, the
simulator and the judge. After a run on a fleet (and one embedded), the test looks for
them everywhere something is written or sent on the way:
- every row of every table of the database (dumped as text), which holds the run's
  stored config, its cases, turns, agent calls and the stored reports;
- the SQLite files of the embedded run, byte for byte;
- the JSONL and console output, the `report` command's JSON, the submitters' stdout and
  stderr, the workers' logs;
- Flower's view of the tasks (its API, which shows each task's arguments) and every
  command the broker received (`redis-cli MONITOR` on a private Redis, message bodies
  decoded).
The agent must have received both secrets on every request, so the test can fail.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fault_kit import Fault, FaultAgent, Request, openai_agent, write_config
from fleet import (
    Fleet,
    RedisServer,
    _die_with_parent,
    expense_case,
    free_port,
    greeting_case,
    run_id_of,
    wait_until,
    write_cases,
)

from agenttest_worker.store.sql.db import upgrade

# Every test here runs Celery workers and `celery flower` (tests/fleet.py).
pytestmark = pytest.mark.fleet

KEY_ENV = "AGENTTEST_SECRET_TEST_KEY"
TENANT_ENV = "AGENTTEST_SECRET_TEST_TENANT"


def _cases() -> list[dict[str, Any]]:
    judged = greeting_case("S-JUDGED")
    judged["assertions"].append(
        {
            "type": "agent",
            "use": "agents:secret.judge",
            "options": {"metadata": {"criteria": 'The reply must mention "help you"'}},
        }
    )
    simulated = {
        "id": "S-SIM",
        "input": "Help me file an expense [case S-SIM]",
        "tool_mocks": {"create_expense": {"id": "EXP-S", "status": "draft"}},
        "simulator": {
            "use": "agents:secret.sim",
            "metadata": {"goal": "Submit a client dinner expense", "max_turns": 6},
        },
        "final_assertions": [{"type": "contains", "value": "submitted"}],
    }
    return [expense_case("S-STATIC"), judged, simulated, greeting_case("S-REFUSED")]


def _config(directory: Path, base_url: str) -> Path:
    def entry(model: str) -> dict[str, Any]:
        return openai_agent(
            base_url,
            model=model,
            api_key_env=KEY_ENV,
            headers={"X-Tenant": f"${{{TENANT_ENV}}}"},
            max_retries=0,
        )

    return write_config(
        directory,
        {
            "secret.expense": {**entry("expense"), "tools": ["create_expense"]},
            "secret.sim": entry("user-sim"),
            "secret.judge": entry("validator"),
        },
    )


def _refuse_one(request: Request) -> Fault | None:
    # An agent error is recorded with the start of the agent's reply: the key must not
    # come back through that path either.
    if request.case == "S-REFUSED":
        body = {"error": {"message": "Incorrect API key provided", "type": "invalid_request"}}
        return Fault(status=401, body=body)
    return None


class Flower:
    """`celery -A agenttest_worker flower` on a free port; its API shows tasks' arguments."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "agenttest_worker",
                "flower",
                "--address=127.0.0.1",
                f"--port={self.port}",
            ],
            env={**env, "FLOWER_UNAUTHENTICATED_API": "true"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        wait_until(lambda: self.get("/api/tasks") is not None, 30, "Flower's API", step=0.2)

    def get(self, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._log.close()


class Monitor:
    """`redis-cli MONITOR`: every command the broker receives, as it receives it."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            ["redis-cli", "-p", str(port), "monitor"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        wait_until(lambda: b"OK" in log_path.read_bytes(), 10, "redis-cli monitor")

    def text(self) -> str:
        """The commands, plus every base64 token decoded (Kombu sends message bodies
        base64-encoded: a secret in a body would not show in the raw log)."""
        raw = self.log_path.read_text(encoding="utf-8", errors="replace")
        decoded = []
        for token in re.findall(r"[A-Za-z0-9+/]{16,}={0,2}", raw):
            try:
                decoded.append(base64.b64decode(token + "=" * (-len(token) % 4)).decode())
            except (binascii.Error, UnicodeDecodeError):
                continue
        return raw + "\n" + "\n".join(decoded)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._log.close()


def _dump_postgres(url: str) -> str:
    """Every row of every table, as text."""
    lines: list[str] = []
    with psycopg.connect(url) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
        ]
        assert {"runs", "cases", "turns", "agent_calls", "run_reports"} <= set(tables)
        for table in tables:
            lines += [
                f"{table}: {row[0]}" for row in conn.execute(f'SELECT t::text FROM "{table}" t')
            ]
    return "\n".join(lines)


def _dump_files(root: Path) -> str:
    """Every file under `root`, bytes decoded leniently, plus SQLite databases row by row."""
    parts: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        parts.append(path.read_bytes().decode("utf-8", errors="replace"))
        if path.suffix == ".db":
            with sqlite3.connect(path) as conn:
                parts += list(conn.iterdump())
    return "\n".join(parts)


@pytest.fixture
def secret_env() -> Iterator[dict[str, str]]:
    yield {
        KEY_ENV: f"sk-test-{secrets.token_hex(16)}",
        TENANT_ENV: f"tenant-{secrets.token_hex(16)}",
    }


def test_api_keys_never_reach_the_database_reports_logs_or_broker(
    pg_database: str, demo_url: str, tmp_path: Path, secret_env: dict[str, str]
) -> None:
    upgrade(pg_database)
    key, tenant = secret_env[KEY_ENV], secret_env[TENANT_ENV]
    with (
        RedisServer(tmp_path / "redis") as redis_server,
        FaultAgent(demo_url) as agent,
    ):
        agent.rule = _refuse_one
        config = _config(tmp_path, agent.base_url)
        cases = write_cases(tmp_path, _cases())
        fleet = Fleet(redis_server.url, pg_database, tmp_path, env=dict(secret_env))
        monitor = Monitor(redis_server.port, tmp_path / "monitor.log")
        flower = None
        try:
            # Task events from the start, so that Flower sees every task of the run.
            fleet.start("w", concurrency=2, wait=False, task_events="true")
            flower = Flower(fleet.env, tmp_path / "flower.log")
            fleet.workers[0].wait_ready()
            out = tmp_path / "fleet.jsonl"
            args = ["-i", str(cases), "-n", "secret.expense", "--config", str(config), "-v"]
            ran = fleet.submit([*args, "-o", str(out)])
            assert ran.returncode == 1, ran.stderr  # S-REFUSED failed
            run_id = run_id_of(ran.stderr)
            report = fleet.submit(["report", run_id, "--format", "json", "-v"])
            assert report.returncode == 1, report.stderr
            flower_tasks = wait_until(
                lambda: (
                    (text := flower.get("/api/tasks")) and "agenttest.aggregate" in text and text
                ),
                20,
                "Flower to see the run's tasks",
            )
            flower_workers = flower.get("/api/workers") or ""
            # The same cases embedded: no broker, the store in SQLite under AGENTTEST_HOME.
            home = tmp_path / "embedded-home"
            env = {k: v for k, v in fleet.env.items() if not k.startswith("AGENTTEST_")}
            embedded = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "agenttest_submit.cli",
                    *args,
                    "-o",
                    str(tmp_path / "e.jsonl"),
                ],
                env={**env, **secret_env, "AGENTTEST_HOME": str(home)},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
            assert embedded.returncode == 1, embedded.stderr
        finally:
            monitor.close()
            if flower is not None:
                flower.close()
            fleet.close()

    # The agent got both secrets, on every call (target, simulator, judge).
    seen = agent.seen()
    assert {r.model for r in seen} == {"expense", "user-sim", "validator"}
    assert {r.headers.get("Authorization") for r in seen} == {f"Bearer {key}"}
    assert {r.headers.get("X-Tenant") for r in seen} == {tenant}

    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert {c: r["status"] for c, r in records.items()} == {
        "S-STATIC": "passed",
        "S-JUDGED": "passed",
        "S-SIM": "passed",
        "S-REFUSED": "failed",
    }
    assert "Incorrect API key provided" in records["S-REFUSED"]["turns"][0]["error"]

    database = _dump_postgres(pg_database)
    places = {
        "database (every table)": database,
        "embedded store (SQLite files)": _dump_files(home),
        "fleet JSONL": out.read_text(),
        "embedded JSONL": (tmp_path / "e.jsonl").read_text(),
        "submitter stdout/stderr": ran.stdout + ran.stderr,
        "report command": report.stdout + report.stderr,
        "embedded stdout/stderr": embedded.stdout + embedded.stderr,
        "worker logs": fleet.logs(),
        "Flower tasks": flower_tasks,
        "Flower workers": flower_workers,
        "Flower log": (tmp_path / "flower.log").read_text(errors="replace"),
        "broker traffic (MONITOR)": monitor.text(),
        "local state of the fleet's submitter": _dump_files(tmp_path / ".agenttest"),
    }
    # The places hold what the run did (else finding no secret there would prove nothing).
    for name in ("database (every table)", "Flower tasks", "broker traffic (MONITOR)"):
        assert run_id in places[name], name
    # (turn messages and task events, decoded from the bodies)
    assert re.search(rf'"{run_id}",\s*"S-STATIC",\s*2\]', places["broker traffic (MONITOR)"])
    assert '"type": "task-received"' in places["broker traffic (MONITOR)"]
    assert f"${{{TENANT_ENV}}}" in database  # the config is stored as written
    assert json.loads(flower_tasks)  # tasks with their arguments
    for secret in (key, tenant):
        # The whole value and its random part alone (a truncated or masked copy).
        for needle in (secret, secret.split("-")[-1]):
            leaks = [name for name, text in places.items() if needle in text]
            assert not leaks, f"a secret ({needle[:6]}…) leaked into: {leaks}"
