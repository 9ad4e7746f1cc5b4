"""Shared fixtures: the demo agents over HTTP, a private Postgres database and Redis db.

Tests that need a service fail loudly when it is missing: a skipped service test would
hide exactly the failures these tests exist to catch. `.ci/run` starts the services.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenttest_worker.demo.server import DemoServer
from agenttest_worker.settings import get_settings

PG_ADMIN_URL = os.environ.get("AGENTTEST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AGENTTEST_TEST_REDIS", "redis://127.0.0.1:6379")
SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Fleet tests start Celery workers (and time what they do): one at a time, in one
    # test process, while the others run the rest (pyproject.toml's addopts).
    for item in items:
        if item.get_closest_marker("fleet") is not None:
            item.add_marker(pytest.mark.xdist_group("fleet"))


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


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A Postgres database of this test session's own, dropped at the end."""
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
    from agenttest_worker.store.db import get_engine

    get_engine.cache_clear()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
    # Redis never take the same number (each empties its database when it starts).
    for number in range(1, 16):
        db = redis.Redis.from_url(f"{REDIS_URL}/{number}")
        if db.set("agenttest:db-owner", token, nx=True, ex=3600):
            db.flushdb()
            db.set("agenttest:db-owner", token, ex=3600)
            yield f"{REDIS_URL}/{number}"
            db.flushdb()
            return
    pytest.fail("no free Redis database number (1-15) for this test run")
