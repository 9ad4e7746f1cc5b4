"""Metrics are served on loopback by default, and behind a token anywhere else: a worker's
(AGENTTEST_METRICS_HOST/TOKEN) and the fleet exporter's (`metrics --host/--token`)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet import Fleet, fleet_on, free_port, lines_read, wait_until
from prometheus_client import CollectorRegistry, Counter

from agenttest_worker.observe import MetricsEndpoint, serve_metrics

TOKEN = "scrape-token-7f3a"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("agenttest_probe", "a counter for this test", registry=registry).inc()
    return registry


def _basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()


def test_loopback_needs_no_token() -> None:
    server = serve_metrics(_registry(), MetricsEndpoint("127.0.0.1", 0))
    try:
        answered = httpx.get(f"http://127.0.0.1:{server.port}/metrics")
        assert answered.status_code == 200
        assert "agenttest_probe_total 1.0" in answered.text
    finally:
        server.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "metrics.example.com", "::"])
def test_another_address_without_a_token_is_refused(host: str) -> None:
    endpoint = MetricsEndpoint(host, 0)
    assert endpoint.problem() is not None and host in str(endpoint.problem())
    with pytest.raises(ValueError, match="not a loopback address"):
        serve_metrics(_registry(), endpoint)


def test_with_a_token_every_scrape_must_carry_it() -> None:
    server = serve_metrics(_registry(), MetricsEndpoint("0.0.0.0", 0, TOKEN))
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        for refused in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": _basic("no")}):
            answer = httpx.get(url, headers=refused)
            assert answer.status_code == 401, refused
            assert "agenttest_probe" not in answer.text
        for accepted in ({"Authorization": f"Bearer {TOKEN}"}, {"Authorization": _basic(TOKEN)}):
            answer = httpx.get(url, headers=accepted)
            assert answer.status_code == 200 and "agenttest_probe_total" in answer.text
    finally:
        server.close()


def _exporter(args: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env["AGENTTEST_DATABASE_URL"] = f"sqlite:///{tmp_path / 'runs.db'}"
    return subprocess.Popen(
        [sys.executable, "-m", "agenttest_submit.cli", "metrics", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_exporter_refuses_another_address_without_a_token(tmp_path: Path) -> None:
    exporter = _exporter(["--host", "0.0.0.0", "--port", str(free_port())], tmp_path)
    _, err = exporter.communicate(timeout=60)
    assert exporter.returncode == 2, err
    assert "--host" in err and "not a loopback address" in err and "Traceback" not in err


def test_the_exporter_with_a_token_asks_every_scrape_for_it(tmp_path: Path) -> None:
    port = free_port()
    exporter = _exporter(["--host", "0.0.0.0", "--port", str(port), "--token", TOKEN], tmp_path)
    lines, _ = lines_read(exporter.stderr)
    try:
        wait_until(lambda: any("serving fleet metrics" in line for line in lines), 30, "serving")
        assert any("token required" in line for line in lines)
        url = f"http://127.0.0.1:{port}/metrics"
        assert httpx.get(url).status_code == 401
        answered = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
        assert answered.status_code == 200 and "agenttest_exporter_up" in answered.text
        assert TOKEN not in "".join(lines)
    finally:
        exporter.terminate()
        exporter.wait(10)


@pytest.mark.fleet
def test_a_worker_serves_on_loopback_unless_given_a_token(fleet: Fleet) -> None:
    open_port, guarded_port = free_port(), free_port()
    plain = fleet.start("plain", metrics_port=str(open_port))
    guarded = fleet.start(
        "guarded", metrics_port=str(guarded_port), metrics_host="0.0.0.0", metrics_token=TOKEN
    )
    refused_port = free_port()
    refused = fleet.start("refused", metrics_port=str(refused_port), metrics_host="0.0.0.0")
    assert httpx.get(f"http://127.0.0.1:{open_port}/metrics").status_code == 200
    url = f"http://127.0.0.1:{guarded_port}/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # Asked for every address without a token, the worker serves nothing and says why;
    # it still plays turns.
    wait_until(lambda: "not a loopback address" in refused.log(), 20, "the refusal logged")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{refused_port}/metrics")
    assert TOKEN not in fleet.logs()
    assert plain.log() and guarded.log()
