"""The Redis broker transport: kombu's, with one Redis client per channel (broker.py)."""

from __future__ import annotations

import subprocess
import sys

import redis

from agenttest_worker.broker import Channel, Transport


def test_a_channel_publishes_through_one_client_and_urls_stay_redis(redis_db: str) -> None:
    from celery import Celery

    from agenttest_worker.broker import use_shared_clients

    use_shared_clients()
    app = Celery(broker=redis_db)
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
        # Flower tells the broker's kind from the URL scheme.
        assert connection.as_uri().startswith("redis://")
        with connection.Producer() as producer:
            producer.publish({"n": 0}, routing_key="broker-test", declare=[])
            channel = producer.channel
            assert isinstance(channel, Channel)
            client = channel._shared_client
            assert client is not None
            for n in range(1, 100):
                producer.publish({"n": n}, routing_key="broker-test")
            assert channel._shared_client is client
    assert redis.Redis.from_url(redis_db).llen("broker-test") == 100


def test_the_app_uses_it_for_redis_brokers_only(redis_db: str) -> None:
    code = (
        "from agenttest_worker.celery_app import app\n"
        "print(type(app.connection_for_write().transport).__module__)"
    )

    def transport_module(broker: str) -> str:
        env = {"AGENTTEST_BROKER_URL": broker, "PATH": ""}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    assert transport_module(redis_db) == "agenttest_worker.broker"
    assert transport_module("memory://") == "kombu.transport.memory"


def test_a_channel_closed_after_its_connection_leaves_its_unacked_messages(
    redis_db: str,
) -> None:
    """A broker outage can close a worker's connection under its consumer channel; closing
    the channel then must not raise (kombu's did, and the worker stopped), and what it
    had taken stays in the unacked hash for the restore sweep."""
    from celery import Celery

    from agenttest_worker.broker import use_shared_clients

    use_shared_clients()
    app = Celery(broker=redis_db)
    connection = app.connection_for_write()
    channel = connection.default_channel
    assert isinstance(channel, Channel)
    with connection.Producer() as producer:
        producer.publish({"n": 1}, routing_key="outage-test", declare=[])
    message = channel.basic_get("outage-test", no_ack=False)
    assert message is not None
    server = redis.Redis.from_url(redis_db)
    assert server.hlen("unacked") == 1

    connection.transport.client = None  # what kombu leaves once the connection is closed
    channel.close()

    assert server.hlen("unacked") == 1, "left for the restore sweep, not lost"
    assert server.llen("outage-test") == 0
