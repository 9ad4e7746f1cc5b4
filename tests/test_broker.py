"""The Redis broker transport: kombu's, with one Redis client per channel, a channel
closed after its connection that does not stop the worker, and a consumer's
acknowledgments carried by the next message's bookkeeping (broker.py); for `redis://`
and `rediss://` (TLS) brokers alike."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from agenttest_worker.fleet.transport import Channel, Transport


@pytest.fixture(params=["redis", "rediss"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A private Redis server, plain or speaking TLS only."""
    with RedisServer(tmp_path / "redis", tls=request.param == "rediss") as server:
        yield server.url


def _server(url: str) -> redis.Redis:
    """A plain redis-py client on the broker, to look at what it holds."""
    return redis.Redis.from_url(url)


def test_a_channel_publishes_through_one_client_and_urls_keep_their_scheme(
    broker_url: str,
) -> None:
    from celery import Celery

    from agenttest_worker.fleet.transport import use_shared_clients

    use_shared_clients()
    app = Celery(broker=broker_url)
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
        # Flower tells the broker's kind from the URL scheme.
        assert connection.as_uri().startswith(broker_url.split(":")[0] + "://")
        with connection.Producer() as producer:
            producer.publish({"n": 0}, routing_key="broker-test", declare=[])
            channel = producer.channel
            assert isinstance(channel, Channel)
            client = channel._shared_client
            assert client is not None
            for n in range(1, 100):
                producer.publish({"n": n}, routing_key="broker-test")
            assert channel._shared_client is client
    assert _server(broker_url).llen("broker-test") == 100


def test_the_app_uses_it_for_redis_brokers_only(redis_db: str) -> None:
    code = (
        "from agenttest_worker.fleet.app import app\n"
        "print(type(app.connection_for_write().transport).__module__)"
    )

    def started(broker: str) -> subprocess.Popen[str]:
        env = {"AGENTTEST_BROKER_URL": broker, "PATH": ""}
        return subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    def transport_module(process: subprocess.Popen[str]) -> str:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        return out.strip()

    # One process per broker URL, all started at once (each pays Celery's import).
    tls = "rediss://127.0.0.1:6379/0?ssl_cert_reqs=required"  # (nothing is connected)
    plain, secure, memory = (started(url) for url in (redis_db, tls, "memory://"))
    assert transport_module(plain) == "agenttest_worker.fleet.transport"
    assert transport_module(secure) == "agenttest_worker.fleet.transport"
    assert transport_module(memory) == "kombu.transport.memory"


def test_a_channel_closed_after_its_connection_leaves_its_unacked_messages(
    broker_url: str,
) -> None:
    """A broker outage can close a worker's connection under its consumer channel; closing
    the channel then must not raise (kombu's did, and the worker stopped), and what it
    had taken stays in the unacked hash for the restore sweep."""
    from celery import Celery

    from agenttest_worker.fleet.transport import use_shared_clients

    use_shared_clients()
    app = Celery(broker=broker_url)
    connection = app.connection_for_write()
    channel = connection.default_channel
    assert isinstance(channel, Channel)
    with connection.Producer() as producer:
        producer.publish({"n": 1}, routing_key="outage-test", declare=[])
    message = channel.basic_get("outage-test", no_ack=False)
    assert message is not None
    server = _server(broker_url)
    assert server.hlen("unacked") == 1

    connection.transport.client = None  # what kombu leaves once the connection is closed
    channel.close()

    assert server.hlen("unacked") == 1, "left for the restore sweep, not lost"
    assert server.llen("outage-test") == 0


def test_a_late_ack_on_a_channel_closed_with_its_connection_leaves_the_message(
    broker_url: str,
) -> None:
    """A turn that finishes after a broker outage closed its consumer's connection and
    channel acknowledges its message there (kombu raised AttributeError, and the worker
    stopped): the message stays in the unacked hash, for the restore sweep."""
    from celery import Celery

    from agenttest_worker.fleet.transport import use_shared_clients

    use_shared_clients()
    app = Celery(broker=broker_url)
    connection = app.connection_for_write()
    channel = connection.default_channel
    with connection.Producer() as producer:
        for n in (1, 2):
            producer.publish({"n": n}, routing_key="late-ack-test", declare=[])
    first = channel.basic_get("late-ack-test", no_ack=False)
    second = channel.basic_get("late-ack-test", no_ack=False)
    assert first is not None and second is not None
    server = _server(broker_url)
    assert server.hlen("unacked") == 2

    connection.transport.client = None
    channel.close()
    assert channel.connection is None
    first.ack()
    second.reject(requeue=True)

    assert server.hlen("unacked") == 2, "both left for the restore sweep"
    assert server.llen("late-ack-test") == 0


def _consuming_app(broker_url: str) -> Any:
    """A Celery app on `broker_url` whose queues have the fleet's two priority lists."""
    from celery import Celery

    from agenttest_worker.fleet.queues import PRIORITY_SEPARATOR, PRIORITY_STEPS
    from agenttest_worker.fleet.transport import use_shared_clients

    use_shared_clients()
    app = Celery(broker=broker_url)
    app.conf.broker_transport_options = {
        "priority_steps": list(PRIORITY_STEPS),
        "sep": PRIORITY_SEPARATOR,
    }
    return app


def _script_calls(server: redis.Redis) -> int:
    stats = server.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def test_a_consumer_takes_the_waiting_messages_along_with_one_brpop(broker_url: str) -> None:
    """The message BRPOP gives is recorded by one script that also takes what the
    prefetch count leaves of the messages behind it, first the higher priority's list,
    each in the order published; every one is held in the unacked hash as kombu stores
    it, and acknowledged, the next read takes the next ones."""
    from kombu import Consumer, Queue

    app = _consuming_app(broker_url)
    server = _server(broker_url)
    queue = Queue("take-test", routing_key="take-test")
    with app.connection_for_write() as connection:
        with connection.Producer() as producer:
            for n in range(6):
                producer.publish({"n": n}, routing_key="take-test", declare=[queue], priority=9)
            producer.publish({"n": "first"}, routing_key="take-test", declare=[queue], priority=0)
        channel = connection.channel()
        received: list[Any] = []
        consumer = Consumer(channel, [queue], callbacks=[lambda _, m: received.append(m)])
        consumer.qos(prefetch_count=4)
        with consumer:
            connection.drain_events(timeout=2)
            assert [m.decode()["n"] for m in received] == ["first", 0, 1, 2]
            assert server.hlen("unacked") == 4 and server.zcard("unacked_index") == 4
            for message in received:
                stored = json.loads(server.hget("unacked", message.delivery_tag) or b"null")
                envelope = message.serializable()
                assert stored == [envelope, message.delivery_info["exchange"], "take-test"]
                assert message._raw is None  # recorded: the decoded envelope let go
            assert server.llen("take-test:9") == 3
            assert channel.qos.backlog, "took all it asked for: more may wait"

            for message in received:
                message.ack()
            received.clear()
            before = _script_calls(server)  # (the script is loaded by now)
            connection.drain_events(timeout=2)
            assert [m.decode()["n"] for m in received] == [3, 4, 5]
            assert _script_calls(server) == before + 1, "three messages, one script"
            assert not channel.qos.backlog, "asked for three, two were left: none waits"
            for message in received:
                message.ack()
        assert server.hlen("unacked") == 0 and server.llen("take-test:9") == 0
        channel.close()


def test_a_busy_consumer_waits_a_moment_for_more_free_slots_before_its_brpop(
    broker_url: str,
) -> None:
    """With messages waiting and fewer than an eighth of its slots free, a consumer on an
    event loop holds its next BRPOP until that many are free or GATHER_SECONDS have
    passed (a timer sends it); enough free slots, an empty queue, or no event loop
    (plain `drain_events`), and it is sent at once."""
    from kombu import Consumer, Queue
    from kombu.asynchronous import Hub

    from agenttest_worker.fleet.transport import GATHER_SECONDS

    app = _consuming_app(broker_url)
    queue = Queue("gather-test", routing_key="gather-test")
    with app.connection_for_write() as connection:
        with connection.Producer() as producer:
            for n in range(70):
                producer.publish({"n": n}, routing_key="gather-test", declare=[queue])
        channel = connection.channel()
        received: list[Any] = []
        consumer = Consumer(channel, [queue], callbacks=[lambda _, m: received.append(m)])
        consumer.qos(prefetch_count=64)  # gathers until 8 slots are free
        with consumer:
            while len(received) < 64:  # no event loop: each BRPOP sent at once
                connection.drain_events(timeout=2)
            assert channel.qos.backlog, "6 messages still wait"
            for message in received[:3]:
                message.ack()
            hub = Hub()
            connection.transport.hub = hub

            channel._brpop_start()
            assert not channel._in_poll, "3 slots free of the 8 it waits for: held"
            assert len(hub.timer) == 1, "a timer ends the wait"
            time.sleep(GATHER_SECONDS * 2)
            channel._brpop_start()
            assert not channel._in_poll, "a tick does not end it: the timer does"
            assert len(hub.timer) == 1
            hub.fire_timers()
            assert channel._in_poll, "sent by the timer itself"
            channel._brpop_read()
            assert len(received) == 67, "the BRPOP's message and two more"

            for message in received[3:12]:
                message.ack()
            assert channel.qos.backlog
            channel._brpop_start()
            assert channel._in_poll, "9 slots free: sent at once"
            channel._brpop_read()
            assert len(received) == 70 and not channel.qos.backlog

            for message in received[12:20]:
                message.ack()
            channel._brpop_start()
            assert channel._in_poll, "none waits: sent at once"
            for message in received[20:]:
                message.ack()
        connection.transport.hub = None
        channel.close()


def test_messages_taken_along_but_not_delivered_go_back_first_in_line(broker_url: str) -> None:
    """A consumer whose callback fails on a message: the messages taken with it and not
    yet delivered are back at the head of their list, in order, and no longer held (the
    one that failed stays held, as with kombu's own BRPOP, for the restore sweep)."""
    from kombu import Consumer, Queue

    app = _consuming_app(broker_url)
    server = _server(broker_url)
    queue = Queue("give-back-test", routing_key="give-back-test")
    seen: list[Any] = []

    def failing_on_the_second(_: Any, message: Any) -> None:
        seen.append(message.decode()["n"])
        if len(seen) == 2:
            raise RuntimeError("a consumer that fails")

    with app.connection_for_write() as connection:
        with connection.Producer() as producer:
            for n in range(5):
                producer.publish({"n": n}, routing_key="give-back-test", declare=[queue])
        channel = connection.channel()
        consumer = Consumer(channel, [queue], callbacks=[failing_on_the_second])
        consumer.qos(prefetch_count=10)
        with consumer, pytest.raises(RuntimeError, match="a consumer that fails"):
            connection.drain_events(timeout=2)
        assert seen == [0, 1]
        assert server.hlen("unacked") == 2, "the two delivered stay held"
        left = [json.loads(raw) for raw in server.lrange("give-back-test", 0, -1)]
        # LPUSH publishes and RPOP takes: the head of the line is the list's right end.
        assert [kombu_body(m)["n"] for m in reversed(left)] == [2, 3, 4]


def kombu_body(message: dict[str, Any]) -> Any:
    """A raw kombu message's body, decoded."""
    import base64

    return json.loads(base64.b64decode(message["body"]))


@pytest.mark.fleet
def test_a_fleet_runs_through_a_tls_broker(pg_database: str, demo_url: str, tmp_path: Path) -> None:
    """Workers, the submitter and an agent's fleet-wide rate limit (kept in Redis) over
    `rediss://`: a run is stored, played and aggregated as over plain Redis."""
    from agenttest_worker.store.db import upgrade

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


def test_a_held_message_is_stored_as_read_and_given_back_whole(broker_url: str) -> None:
    """The unacked hash keeps a taken message as the text it was read from (not encoded
    again): what kombu's restore reads back, with the message's exchange and key."""
    from celery import Celery

    from agenttest_worker.fleet.transport import use_shared_clients

    use_shared_clients()
    app = Celery(broker=broker_url)
    connection = app.connection_for_write()
    channel = connection.default_channel
    body = {"n": 1, "text": 'caf\u00e9 "quoted" \\ back'}
    with connection.Producer() as producer:
        producer.publish(body, routing_key="held-test", declare=[], headers={"h": [1, 2]})
    message = channel.basic_get("held-test", no_ack=False)
    assert message is not None
    server = _server(broker_url)
    stored = json.loads(server.hget("unacked", message.delivery_tag) or b"null")
    assert stored == [message.serializable(), message.delivery_info["exchange"], "held-test"]
    assert message._raw is None  # recorded: the decoded envelope let go
    assert server.zscore("unacked_index", message.delivery_tag) is not None

    channel.close()  # a warm shutdown gives back what it held

    assert server.hlen("unacked") == 0
    again = connection.channel().basic_get("held-test", no_ack=True)
    assert again is not None
    assert again.decode() == body and again.headers["h"] == [1, 2]
    assert again.delivery_info.get("redelivered") is True
    connection.release()


def test_messages_taken_share_their_envelopes_strings_and_decode_as_published(
    broker_url: str,
) -> None:
    """A worker holds each message it runs: their envelopes' keys and short values are
    one copy for all (interned), long ones each message's own, and kombu's own types
    (a datetime header) still decode as kombu writes them."""
    from datetime import UTC, datetime

    from celery import Celery

    from agenttest_worker.fleet.transport import use_shared_clients

    use_shared_clients()
    app = Celery(broker=broker_url)
    connection = app.connection_for_write()
    channel = connection.default_channel
    when = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    long_text = "x" * 200
    with connection.Producer() as producer:
        for n in range(2):
            headers = {"kind": "turn", "when": when, "long": long_text, "n": n}
            producer.publish({"n": n}, routing_key="shared-test", declare=[], headers=headers)
    first, second = (channel.basic_get("shared-test", no_ack=True) for _ in range(2))
    assert first is not None and second is not None
    assert [first.decode(), second.decode()] == [{"n": 0}, {"n": 1}]
    assert first.headers["when"] == when == second.headers["when"]
    assert (first.headers["n"], second.headers["n"]) == (0, 1)
    key_first = next(k for k in first.headers if k == "kind")
    key_second = next(k for k in second.headers if k == "kind")
    assert key_first is key_second
    assert first.headers["kind"] is second.headers["kind"]
    assert first.properties["body_encoding"] is second.properties["body_encoding"]
    assert first.headers["long"] == second.headers["long"] == long_text
    assert first.headers["long"] is not second.headers["long"]
    connection.release()


@pytest.mark.fleet
def test_a_busy_worker_acknowledges_every_message_and_leaves_none_held(
    pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """Acknowledgments ride on the next message's bookkeeping (one transaction per message
    instead of two), and the last ones, with no message after them, go by a timer while
    the worker still runs; a warm shutdown then has nothing to give back. (A private Redis
    server, so that its command counts are this worker's alone.)"""
    from agenttest_worker.store.db import upgrade

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
    # kombu's own transport runs one MULTI/EXEC to record a message and one to ack it.
    assert calls["cmdstat_exec"] < 1.5 * taken, calls
    # Here messages are recorded, and the acknowledgments due removed, by one script
    # (how many it takes at once depends on the timing: test_a_consumer_takes_...).
    assert calls["cmdstat_evalsha"] >= 1, calls
    assert held == 0 and queued == 0, "a warm shutdown had nothing to give back"
    assert "could not acknowledge" not in logs and "Unrecoverable error" not in logs
