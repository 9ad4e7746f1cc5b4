"""Shared fixtures: the demo agents over HTTP, a private Postgres database, Redis db and
RabbitMQ virtual host.

Tests that need a service fail loudly when it is missing: a skipped service test would
hide exactly the failures these tests exist to catch. `.ci/run` starts the services.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agenttest_worker.demo.demo_server import DemoServer
from agenttest_worker.settings import get_settings

PG_ADMIN_URL = os.environ.get("AGENTTEST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AGENTTEST_TEST_REDIS", "redis://127.0.0.1:6379")
RABBITMQ = os.environ.get("AGENTTEST_TEST_RABBITMQ", "guest:guest@127.0.0.1:5672")
# Who holds a Redis database number: set, and the database emptied, in one step.
OWNER_KEY = "agenttest:db-owner"
CLAIM_SCRIPT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('FLUSHDB')
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
if TYPE_CHECKING:
    from fleet import Fleet

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"


@pytest.fixture(scope="session")
def demo_url() -> Iterator[str]:
    """Base URL (…/v1) of the demo agents, served on a free port for the whole session."""
    with DemoServer(port=0) as server:
        yield server.base_url


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test gets its own embedded store and no broker unless it asks for one."""
    for name in list(os.environ):
        if name.startswith("AGENTTEST_") and not name.startswith("AGENTTEST_TEST_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTTEST_HOME", str(tmp_path / ".agenttest"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def demo(demo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo agents reachable through the suite's agenttest.yaml; cwd is tmp_path."""
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@contextmanager
def _new_pg_database() -> Iterator[str]:
    """A new, empty Postgres database, dropped when done."""
    import psycopg

    name = f"agenttest_test_{os.getpid()}_{secrets.token_hex(3)}"
    admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {admin} (start it; see .ci/run): {exc}")
    base = admin.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A Postgres database of this test session's own, dropped at the end."""
    with _new_pg_database() as url:
        yield url
        from agenttest_worker.store.sql.db import get_engine

        get_engine.cache_clear()


@pytest.fixture
def empty_pg_database() -> Iterator[str]:
    """A Postgres database of this test's own with no schema yet, dropped after it."""
    with _new_pg_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_db() -> Iterator[str]:
    """A Redis URL on a database number no other test run is using."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is required at {REDIS_URL} (start it; see .ci/run): {exc}")
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    # The same claim as benchmarks/throughput.py's: a test run and a benchmark on one
    # Redis never take the same number. The claim and the emptying are one script:
    # emptying after a separate claim deleted the claim too, and a second run starting
    # in between took the same number (their workers then ate each other's turns).
    claim = client.register_script(CLAIM_SCRIPT)
    for number in range(1, 16):
        db = redis.Redis.from_url(f"{REDIS_URL}/{number}")
        if claim(keys=[OWNER_KEY], args=[token, 3600], client=db):
            yield f"{REDIS_URL}/{number}"
            db.flushdb()
            return
    pytest.fail("no free Redis database number (1-15) for this test run")


def _rabbitmqctl(*args: str) -> None:
    import subprocess

    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.fail(f"rabbitmqctl {' '.join(args)} failed (see .ci/run): {done.stderr.strip()}")


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """An AMQP URL on a RabbitMQ virtual host of this test session's own (its queues
    shared with no other test run), deleted at the end."""
    import socket

    host, port = RABBITMQ.rsplit("@", 1)[1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        pytest.fail(f"RabbitMQ is required at {host}:{port} (start it; see .ci/run): {exc}")
    user = RABBITMQ.split(":", 1)[0]
    vhost = f"agenttest_test_{os.getpid()}_{secrets.token_hex(3)}"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield f"amqp://{RABBITMQ}/{vhost}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)


@pytest.fixture(params=["redis", "rabbitmq"])
def any_broker(request: pytest.FixtureRequest) -> str:
    """Each broker a fleet runs on, in turn: the fleet's core tests run on both."""
    name = "redis_db" if request.param == "redis" else "rabbitmq_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def any_fleet(any_broker: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet (tests/fleet.py) on each broker in turn."""
    from fleet import fleet_on

    yield from fleet_on(any_broker, pg_database, demo_url, tmp_path)
