"""Hostile broker messages on a real fleet: items on the queue that are not kombu
messages, and entries in the Redis transport's unacknowledged hash that cannot be
restored. A worker logs and moves aside what it cannot read, and keeps consuming;
a worker starts whatever the unacknowledged hash holds.

The Redis tests push onto the queue's list and write the transport's `unacked` hash
and `unacked_index` sorted set directly, exactly as kombu's Redis transport names them;
the RabbitMQ test publishes the same bodies through kombu's public API.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from fleet import Fleet, fleet_on, greeting_case, wait_until, write_cases, write_project
from kombu import Connection, Exchange, Producer, Queue

QUEUE = "agenttest"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture
def rabbitmq_fleet(
    rabbitmq_url: str, pg_database: str, demo_url: str, tmp_path: Path
) -> Iterator[Fleet]:
    yield from fleet_on(rabbitmq_url, pg_database, demo_url, tmp_path)


def genuine_envelope(broker_url: str) -> dict[str, Any]:
    """A real Celery task message (a sweep, harmless) as kombu's Redis transport stores it."""
    probe = Celery("probe", broker=broker_url)
    probe.send_task("agenttest.sweep", queue="probe-capture")
    raw = redis.Redis.from_url(broker_url).rpop("probe-capture")
    assert isinstance(raw, bytes)
    envelope: dict[str, Any] = json.loads(raw)
    return envelope


def variant(envelope: dict[str, Any], **changes: Any) -> bytes:
    copy = json.loads(json.dumps(envelope))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = copy
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[leaf]
        else:
            target[leaf] = value
    return json.dumps(copy).encode()


DELETE = object()


def hostile_items(envelope: dict[str, Any]) -> list[bytes]:
    """Queue items kombu cannot turn into a message, or Celery into a task."""
    good = json.dumps(envelope).encode()
    return [
        b"\xff\xfe\x00not utf-8",
        good.replace(b'"properties"', b'"propert\xffies"'),  # invalid UTF-8 inside
        good[: len(good) // 2],  # truncated JSON
        b"not json at all " + b"x" * 100 + b"TAIL-MARKER",
        b"[]",
        b"{}",
        b'"a string"',
        variant(envelope, properties=None),
        variant(envelope, properties__delivery_info=DELETE),
        variant(envelope, properties__delivery_info__routing_key=None),
        variant(envelope, properties__delivery_tag=DELETE),
        variant(envelope, body="%%% not base64 %%%"),
        variant(envelope, body=12),
        # Decodable by the transport, not by Celery: the consumer's decode-error and
        # unknown-message handling rejects these.
        variant(envelope, body=base64.b64encode(b"\xff not json").decode()),
        variant(envelope, headers__task="agenttest.no-such-task"),
        # A registered task that Celery's Request cannot be built from.
        variant(envelope, body=base64.b64encode(b"[]").decode()),
        variant(envelope, headers__timelimit=[1]),
        variant(envelope, headers=DELETE),
    ]


def hostile_unacked(envelope: dict[str, Any]) -> list[bytes]:
    """Entries of the unacknowledged hash that kombu's restore cannot put back."""
    return [
        b"\xff\xfe\x00not utf-8",
        b"not json",
        b"[]",
        b"{}",
        json.dumps([envelope, "", None]).encode(),  # a null routing key
        json.dumps([envelope, None, None]).encode(),
        json.dumps(["not a message", "", QUEUE]).encode(),
        json.dumps([envelope, "", QUEUE, "extra"]).encode(),
    ]


def passes_a_run(fleet: Fleet, tmp_path: Path, demo_url: str, name: str) -> None:
    """The workers still consume: a run submitted now completes."""
    config = write_project(tmp_path, demo_url)
    cases = write_cases(tmp_path, [greeting_case(f"{name}1"), greeting_case(f"{name}2")], name)
    run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "slow.expense", "--config", str(config)])
    fleet.wait_done(run_id, timeout=60)


@pytest.mark.fleet
def test_hostile_items_on_the_queue_are_moved_aside(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(fleet.broker_url)
    envelope = genuine_envelope(fleet.broker_url)
    items = hostile_items(envelope)
    worker = fleet.start("a", concurrency=2)
    # A good message first, the hostile ones behind it, then a good one again.
    client.lpush(QUEUE, json.dumps(envelope))
    for item in items:
        client.lpush(QUEUE, item)
    client.lpush(QUEUE, json.dumps(envelope))

    wait_until(lambda: client.llen(QUEUE) == 0 or not worker.alive(), 30, "the queue to drain")
    time.sleep(1)
    assert worker.alive(), worker.log()[-4000:]
    passes_a_run(fleet, tmp_path, demo_url, "q")
    assert worker.alive(), worker.log()[-4000:]
    # What the transport could not read is kept aside, whole, for an operator.
    # (In the order they came: BRPOP takes the oldest first.)
    assert client.lrange(f"{QUEUE}.malformed", 0, -1) == items[:-5]
    assert client.hlen("unacked") == 0, client.hgetall("unacked")
    log = worker.log()
    assert log.count(f"malformed broker message moved to {QUEUE}.malformed") == len(items) - 5
    assert "TAIL-MARKER" not in log  # only a short prefix is logged
    # What the transport passes on and Celery cannot use, Celery logs and drops.
    assert "Can't decode message body" in log
    assert "Received unregistered task of type 'agenttest.no-such-task'" in log
    assert log.count("Received invalid task message") == 2


@pytest.mark.fleet
def test_hostile_unacked_entries_do_not_stop_workers_from_starting(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(fleet.broker_url)
    envelope = genuine_envelope(fleet.broker_url)
    entries = hostile_unacked(envelope)
    long_ago = time.time() - 3600
    for number, entry in enumerate(entries):
        tag = f"hostile-{number}"
        client.hset("unacked", tag, entry)
        client.zadd("unacked_index", {tag: long_ago})
    # A genuine entry beside them is still restored and consumed.
    client.hset("unacked", "genuine", json.dumps([envelope, "", QUEUE]))
    client.zadd("unacked_index", {"genuine": long_ago})

    worker = fleet.start("b", concurrency=2)
    wait_until(lambda: client.hlen("unacked") == 0 or not worker.alive(), 30, "the hash to empty")
    time.sleep(1)
    assert worker.alive(), worker.log()[-4000:]
    assert client.zcard("unacked_index") == 0
    moved = client.lrange("unacked.malformed", 0, -1)
    assert sorted(moved) == sorted(entries), moved
    passes_a_run(fleet, tmp_path, demo_url, "u")
    # A second worker starts too.
    second = fleet.start("c")
    assert second.alive() and worker.alive()


@pytest.mark.fleet
def test_hostile_bodies_on_rabbitmq_are_rejected(
    rabbitmq_fleet: Fleet, rabbitmq_url: str, demo_url: str, tmp_path: Path
) -> None:
    fleet = rabbitmq_fleet
    worker = fleet.start("r", concurrency=2)
    bodies: list[tuple[bytes, str, dict[str, Any]]] = [
        (b"\xff\xfe\x00not utf-8", "application/json", {"task": "agenttest.sweep"}),
        (b"not json", "application/json", {"task": "agenttest.sweep", "id": "x"}),
        (b"[]", "application/json", {"task": "agenttest.sweep", "id": "y"}),
        (b"{}", "application/json", {}),
        (b"\xff", "application/x-unknown", {}),
        (b"[[], {}, {}]", "application/json", {"task": "agenttest.no-such-task", "id": "z"}),
        (b"[[], {}, {}]", "application/json", {"task": "agenttest.sweep", "timelimit": [1]}),
    ]
    with Connection(rabbitmq_url) as connection:
        channel = connection.channel()
        queue = Queue(QUEUE, Exchange(QUEUE), QUEUE, max_priority=1)
        producer = Producer(channel)
        for body, content_type, headers in bodies:
            producer.publish(
                body,
                routing_key=QUEUE,
                content_type=content_type,
                content_encoding="binary" if b"\xff" in body else "utf-8",
                headers=headers,
                declare=[queue],
            )

        def drained() -> bool:
            return queue(channel).queue_declare(passive=True).message_count == 0

        wait_until(lambda: drained() or not worker.alive(), 30, "the queue to drain")
    time.sleep(1)
    assert worker.alive(), worker.log()[-4000:]
    passes_a_run(fleet, tmp_path, demo_url, "r")
    assert worker.alive(), worker.log()[-4000:]
    log = worker.log()
    assert log.count("Can't decode message body") == 3
    assert log.count("Received invalid task message") == 2
    assert "Received unregistered task of type 'agenttest.no-such-task'" in log
