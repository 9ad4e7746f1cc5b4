"""The brokers as the fleet uses them through kombu's own transports: Redis over
`redis://` and `rediss://` (TLS) alike, every message a worker took acknowledged, none
left held; RabbitMQ with a Redis beside it (AGENTTEST_REDIS_URL) for what the fleet
shares outside its messages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from fault_kit import openai_agent, write_config
from fleet import (
    Fleet,
    RedisServer,
    case_rows,
    greeting_case,
    wait_until,
    write_cases,
)


def _server(url: str) -> redis.Redis:
    """A plain redis-py client on the broker, to look at what it holds."""
    return redis.Redis.from_url(url)


@pytest.mark.fleet
def test_a_fleet_runs_through_a_tls_broker(pg_database: str, demo_url: str, tmp_path: Path) -> None:
    """Workers, the submitter and an agent's fleet-wide rate limit (kept in Redis) over
    `rediss://`: a run is stored, played and aggregated as over plain Redis."""
    from agenttest_worker.store.sql.db import upgrade

    upgrade(pg_database)
    config = write_config(
        tmp_path, {"limited": openai_agent(demo_url, rate_limit={"requests_per_second": 50})}
    )
    cases = write_cases(tmp_path, [greeting_case(f"TLS{i}") for i in range(4)])
    with RedisServer(tmp_path / "redis", tls=True) as server:
        fleet = Fleet(server.url, pg_database, tmp_path, env={"AGENTTEST_DEMO_URL": demo_url})
        try:
            fleet.start("tls", concurrency=2)
            run_id = fleet.submit_no_wait(
                ["-i", str(cases), "-n", "limited", "--config", str(config)]
            )
            fleet.wait_done(run_id)
            limiter_keys = redis.Redis.from_url(server.url).keys("agenttest:ratelimit*")
        finally:
            fleet.close()
    assert [s for _, _, s in case_rows(pg_database, run_id)] == ["passed"] * 4
    assert limiter_keys, "the rate limit was kept in the broker"
    assert "Unrecoverable error" not in fleet.logs()


@pytest.mark.fleet
def test_a_fleet_on_rabbitmq_shares_its_rate_limits_through_the_redis_beside_it(
    rabbitmq_url: str, redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """The messages go through RabbitMQ; an agent's fleet-wide rate limit is kept in the
    Redis AGENTTEST_REDIS_URL names, as it is in a Redis broker."""
    from fleet import fleet_on

    config = write_config(
        tmp_path, {"limited": openai_agent(demo_url, rate_limit={"requests_per_second": 50})}
    )
    cases = write_cases(tmp_path, [greeting_case(f"AMQP{i}") for i in range(4)])
    server = _server(redis_db)
    for fleet in fleet_on(rabbitmq_url, pg_database, demo_url, tmp_path):
        server.delete(*server.keys("agenttest:ratelimit*"), "agenttest:none")
        fleet.env["AGENTTEST_REDIS_URL"] = redis_db
        fleet.start("amqp", concurrency=2)
        run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "limited", "--config", str(config)])
        fleet.wait_done(run_id)
        limiter_keys = server.keys("agenttest:ratelimit:limited*")
        logs = fleet.logs()
    assert [s for _, _, s in case_rows(pg_database, run_id)] == ["passed"] * 4
    assert limiter_keys, "the rate limit was kept in the Redis beside the broker"
    assert "amqp://" in logs and "Unrecoverable error" not in logs


@pytest.mark.fleet
def test_a_busy_worker_acknowledges_every_message_and_leaves_none_held(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Every message a worker took is acknowledged while it runs; a warm shutdown then has
    nothing to give back. (A private Redis server, so that its command counts are this
    worker's alone.)"""
    from agenttest_worker.store.sql.db import upgrade

    upgrade(pg_database)
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    cases = write_cases(tmp_path, [greeting_case(f"ACK{i}") for i in range(40)])
    with RedisServer(tmp_path / "redis") as redis_server:
        server = _server(redis_server.url)
        fleet = Fleet(redis_server.url, pg_database, tmp_path, env={"AGENTTEST_DEMO_URL": demo_url})
        try:
            worker = fleet.start("acks", concurrency=8)
            run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "demo", "--config", str(config)])
            fleet.wait_done(run_id)
            wait_until(
                lambda: server.hlen("unacked") == 0 and server.zcard("unacked_index") == 0,
                5.0,
                "every message acknowledged in Redis while the worker runs",
            )
            assert worker.alive()
            calls = {
                name: int(stats["calls"])
                for name, stats in server.info("commandstats").items()
                if isinstance(stats, dict)
            }
            worker.stop()
            time.sleep(0.2)
            held = server.hlen("unacked")
            queued = sum(
                int(server.llen(key)) for key in server.scan_iter() if server.type(key) == b"list"
            )
        finally:
            fleet.close()
    logs = fleet.logs()
    assert [s for _, _, s in case_rows(pg_database, run_id)] == ["passed"] * 40
    taken = calls["cmdstat_hset"]  # one per message a worker took
    assert taken >= 40
    assert calls["cmdstat_hdel"] == taken, "every message taken was acknowledged"
    assert held == 0 and queued == 0, "a warm shutdown had nothing to give back"
    assert "Unrecoverable error" not in logs
