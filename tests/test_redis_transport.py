"""The Redis transport a fleet uses (agenttest_worker.fleet.redis_transport) against kombu's
own, on real Redis: one queue item that is not a kombu message, or one entry of the
unacknowledged hash that cannot be restored, raises out of kombu's stock transport
(killing a worker's consumer); the fleet's moves it aside and goes on.

The stock transport's tests document the defect to report upstream: once kombu survives
these, they fail, and the subclass can go.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Queue

from agenttest_worker.fleet.redis_transport import Transport

STOCK = "redis"
CHECKED = "agenttest_worker.fleet.redis_transport:Transport"
HOSTILE = [b"\xff\xfe not utf-8", b"not json", b"[]", b'{"properties": {}}']


@pytest.fixture
def broker(redis_db: str) -> Iterator[str]:
    redis.Redis.from_url(redis_db).delete(
        "hostile", "hostile.malformed", "unacked", "unacked_index", "unacked.malformed"
    )
    yield redis_db


def consume_one(url: str, transport: str, received: list[Any]) -> None:
    """What a worker's consumer does: wait for the next message on the `hostile` queue."""
    options = {"visibility_timeout": 1}
    with (
        Connection(url, transport=transport, transport_options=options) as conn,
        Consumer(conn, [Queue("hostile")], callbacks=[lambda body, m: received.append(body)]),
    ):
        conn.drain_events(timeout=2)


def restore_unacked(url: str, transport: str) -> None:
    """What a worker does at start: restore the unacknowledged entries older than the
    visibility timeout."""
    with Connection(url, transport=transport, transport_options={"visibility_timeout": 1}) as conn:
        conn.default_channel.qos.restore_visible(num=100, interval=1)


@pytest.mark.parametrize("item", HOSTILE)
def test_stock_kombu_dies_of_a_malformed_queue_item(broker: str, item: bytes) -> None:
    redis.Redis.from_url(broker).lpush("hostile", item)
    with pytest.raises((ValueError, TypeError, KeyError)):
        consume_one(broker, STOCK, [])


@pytest.mark.parametrize("item", HOSTILE)
def test_a_malformed_queue_item_is_moved_aside(broker: str, item: bytes) -> None:
    client = redis.Redis.from_url(broker)
    client.lpush("hostile", item)
    received: list[Any] = []
    with pytest.raises(TimeoutError):  # (the item read as nothing: an empty poll)
        consume_one(broker, CHECKED, received)
    assert received == []
    assert client.lrange("hostile.malformed", 0, -1) == [item]
    assert client.llen("hostile") == 0


def hostile_entry(client: redis.Redis, entry: bytes) -> None:
    client.hset("unacked", "tag-1", entry)
    client.zadd("unacked_index", {"tag-1": time.time() - 60})


def test_stock_kombu_dies_of_an_unacked_entry_with_a_null_routing_key(broker: str) -> None:
    client = redis.Redis.from_url(broker)
    hostile_entry(client, json.dumps([{"properties": {}}, "", None]).encode())
    with pytest.raises(redis.DataError):
        restore_unacked(broker, STOCK)


def test_an_unrestorable_unacked_entry_is_moved_aside(broker: str) -> None:
    client = redis.Redis.from_url(broker)
    entry = json.dumps([{"properties": {}}, "", None]).encode()
    hostile_entry(client, entry)
    restore_unacked(broker, CHECKED)
    assert client.lrange("unacked.malformed", 0, -1) == [entry]
    assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0


def test_a_good_message_still_goes_through(broker: str) -> None:
    with Connection(broker, transport=Transport) as conn:
        conn.SimpleQueue("hostile").put({"hello": "world"})
    received: list[Any] = []
    consume_one(broker, CHECKED, received)
    assert received == [{"hello": "world"}]
