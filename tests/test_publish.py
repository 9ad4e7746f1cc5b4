"""Tasks published on Redis in one LPUSH (fleet/enqueue.py, fleet/publish.py) are the
messages Celery's `apply_async` writes, on the list kombu's transport would choose:
compared field by field against Celery's own, in a process whose app uses a real Redis
broker. On any other broker Celery publishes them itself."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from fleet import RedisServer, wait_until

PUBLISHING = """
from agenttest_worker.fleet.enqueue import enqueue_turn, enqueue_turns
from agenttest_worker.fleet.tasks import turn
# Celery's own message, as enqueue_turn published it before (fleet/tasks.py).
turn.apply_async(("r1", "c1", 2), priority=0, argsrepr="('r1', 'c1', 2)", kwargsrepr="{}")
enqueue_turn("r1", "c1", 2)
enqueue_turns("r1", [("c2", 1), ("c3", 1)])
turn.apply_async(("r1", "c9", 1), priority=9, argsrepr="('r1', 'c9', 1)", kwargsrepr="{}")
"""

# Fields that differ between any two messages: each task's id and delivery tag; and
# where a reply would go, Celery's per publishing thread, the Redis publisher's per
# process (no task has a result).
_PER_MESSAGE = {
    ("headers", "id"),
    ("headers", "root_id"),
    ("properties", "correlation_id"),
    ("properties", "reply_to"),
}


def _publish(broker: str) -> None:
    env = {**os.environ, "AGENTTEST_BROKER_URL": broker, "AGENTTEST_QUEUE": "agenttest"}
    done = subprocess.run(
        [sys.executable, "-c", PUBLISHING], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def _comparable(text: bytes) -> dict[str, Any]:
    message = json.loads(text)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    for part, key in _PER_MESSAGE:
        uuid.UUID(message[part][key])  # each of them a UUID
        message[part][key] = "(per message)"
    assert message["headers"]["root_id"] != message["properties"]["delivery_tag"]
    message["properties"]["delivery_tag"] = "(per message)"
    return message


def test_a_published_turn_is_the_message_celery_writes(redis_db: str) -> None:
    client = redis.Redis.from_url(redis_db)
    client.delete("agenttest", "agenttest:9")  # the session's database: other tests' messages
    _publish(redis_db)
    later, first = client.lrange("agenttest", 0, -1), client.lrange("agenttest:9", 0, -1)
    # LPUSH: the newest first. Later turns wait on `agenttest`, first turns on `:9`.
    assert len(later) == 2 and len(first) == 3, (later, first)
    ours, celerys = _comparable(later[0]), _comparable(later[1])
    assert ours == celerys
    assert ours["body"] == [["r1", "c1", 2], {}, celerys["body"][2]]
    assert ours["headers"]["task"] == "agenttest.turn"
    assert ours["headers"]["argsrepr"] == "('r1', 'c1', 2)"

    celerys_first = _comparable(first[0])
    for text, case in ((first[2], "c2"), (first[1], "c3")):
        message = _comparable(text)
        assert message["body"][0] == ["r1", case, 1]
        assert message["properties"]["priority"] == 9
        # The same as Celery's first turn but for the case named in the arguments.
        message["body"][0][1] = "c9"
        for part in ("headers", "properties"):
            message[part]["argsrepr"] = message[part]["argsrepr"].replace(repr(case), "'c9'")
        assert message == celerys_first


PUBLISHING_OTHERS = """
from agenttest_worker.fleet.enqueue import enqueue_aggregate, enqueue_starts
from agenttest_worker.fleet.tasks import aggregate_run, start
# Celery's own messages for the same tasks, their display form given (as for turns).
start.apply_async(("r1", 0, 2), priority=9, argsrepr="('r1', 0, 2)", kwargsrepr="{}")
aggregate_run.apply_async(("r1",), argsrepr="('r1',)", kwargsrepr="{}")
enqueue_starts("r1", 0, 4)  # AGENTTEST_ENQUEUE_BATCH=3: two batches, one pipeline
enqueue_aggregate("r1")
"""


def test_start_batches_and_the_aggregation_are_the_messages_celery_writes(
    redis_db: str,
) -> None:
    client = redis.Redis.from_url(redis_db)
    client.delete("agenttest", "agenttest:9")  # the session's database: other tests' messages
    env = {
        **os.environ,
        "AGENTTEST_BROKER_URL": redis_db,
        "AGENTTEST_QUEUE": "agenttest",
        "AGENTTEST_ENQUEUE_BATCH": "3",
    }
    done = subprocess.run(
        [sys.executable, "-c", PUBLISHING_OTHERS],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # LPUSH: the newest first. Start batches wait with the first turns (`:9`).
    later, first = client.lrange("agenttest", 0, -1), client.lrange("agenttest:9", 0, -1)
    assert len(later) == 2 and len(first) == 3, (later, first)
    assert _comparable(later[0]) == _comparable(later[1])
    assert _comparable(later[0])["headers"]["task"] == "agenttest.aggregate"
    celerys = _comparable(first[2])
    for text, batch in ((first[1], [0, 2]), (first[0], [3, 4])):
        message = _comparable(text)
        assert message["body"][0] == ["r1", *batch]
        assert message["headers"]["argsrepr"] == repr(("r1", *batch))
        message["body"][0] = ["r1", 0, 2]
        for part in ("headers", "properties"):
            message[part]["argsrepr"] = "('r1', 0, 2)"
        assert message == celerys


def test_publishing_on_redis_imports_no_task_body_nor_celery(redis_db: str) -> None:
    """The submitter publishes through fleet.enqueue: the worker's tasks, driver pool
    and metrics stay out of its start-up, and on a Redis broker Celery and kombu too."""
    probe = (
        "import sys; from agenttest_worker.fleet.enqueue import enqueue_starts; "
        "enqueue_starts('r1', 0, 0); "
        "print(sorted(m for m in sys.modules if m in ("
        "'agenttest_worker.fleet.tasks', 'agenttest_worker.fleet.metrics', "
        "'agenttest_worker.fleet.loop_pool', 'prometheus_client', 'celery', 'kombu')))"
    )
    client = redis.Redis.from_url(redis_db)
    client.delete("agenttest", "agenttest:9")  # the session's database: other tests' messages
    env = {**os.environ, "AGENTTEST_BROKER_URL": redis_db, "AGENTTEST_QUEUE": "agenttest"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    (published,) = client.lrange("agenttest:9", 0, -1)
    assert _comparable(published)["body"][0] == ["r1", 0, 0]


OTHER_BROKER = """
import json
from agenttest_worker.fleet.app import app
from agenttest_worker.fleet.enqueue import enqueue_aggregate, enqueue_starts, enqueue_turns
enqueue_turns("r1", [("c1", 2), ("c2", 1)])
enqueue_starts("r1", 0, 2)
enqueue_aggregate("r1")
with app.connection_for_read() as connection:
    queue = connection.SimpleQueue("agenttest")
    got = []
    for _ in range(4):
        message = queue.get(timeout=5)
        got.append([message.headers["task"], message.payload[0], message.properties["priority"]])
        message.ack()
print(json.dumps(got))
"""


def test_on_another_broker_tasks_are_published_by_celery() -> None:
    env = {
        **os.environ,
        "AGENTTEST_BROKER_URL": "memory://",
        "AGENTTEST_QUEUE": "agenttest",
        "AGENTTEST_ENQUEUE_BATCH": "3",
    }
    done = subprocess.run(
        [sys.executable, "-c", OTHER_BROKER], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(got) == [
        ["agenttest.aggregate", ["r1"], 0],
        ["agenttest.start", ["r1", 0, 2], 9],
        ["agenttest.turn", ["r1", "c1", 2], 0],
        ["agenttest.turn", ["r1", "c2", 1], 9],
    ]


PUBLISHING_ACROSS_AN_OUTAGE = """
import pathlib, sys, time
from agenttest_worker.fleet.enqueue import enqueue_turn
enqueue_turn("r1", "c1", 2)  # connected to the broker
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
enqueue_turn("r1", "c2", 2)  # the broker is away now
"""


# A fleet test: it publishes to a broker of its own across a 9 s outage, the slowest test
# outside the fleet tests' share of the suite otherwise.
@pytest.mark.fleet
def test_a_publish_while_the_broker_is_away_is_retried_until_it_is_back(tmp_path: Path) -> None:
    """The broker goes away after the publisher connected, for longer than redis-py's
    own retries of a command (~7 s): the publish retries with the app's policy (about
    20 s in all, fleet/app.py), says so, and lands once the broker is back."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    go = tmp_path / "go"
    env = {**os.environ, "AGENTTEST_BROKER_URL": server.url, "AGENTTEST_QUEUE": "agenttest"}
    publishing = subprocess.Popen(
        [sys.executable, "-c", PUBLISHING_ACROSS_AN_OUTAGE, str(go)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: redis.Redis.from_url(server.url).llen("agenttest") == 1, 30, "c1")
        server.stop()  # (it keeps nothing: c1 is gone with it)
        go.touch()
        time.sleep(9)
        assert publishing.poll() is None, publishing.communicate()[1]
        server.start()
        _, stderr = publishing.communicate(timeout=60)
        assert publishing.returncode == 0, stderr
        assert "publishing 1 task(s) failed" in stderr and "retrying" in stderr, stderr
        queued = redis.Redis.from_url(server.url).lrange("agenttest", 0, -1)
        bodies = [json.loads(base64.b64decode(json.loads(m)["body"]))[0] for m in queued]
        assert bodies == [["r1", "c2", 2]]
    finally:
        if publishing.poll() is None:
            publishing.kill()
        server.stop()


def test_a_tls_broker_is_published_to_with_kombus_spelling_of_its_certificate_rule(
    tmp_path: Path,
) -> None:
    """kombu (the workers' consumer) reads `ssl_cert_reqs=CERT_NONE` as redis-py reads
    `none`: the Redis publisher reads both, over a real TLS connection."""
    from agenttest_worker.fleet.publish import RedisPublisher, TaskMessage
    from agenttest_worker.settings import redis_py_url

    with RedisServer(tmp_path / "redis", tls=True) as server:
        kombus = server.url.replace("ssl_cert_reqs=none", "ssl_cert_reqs=CERT_NONE")
        assert redis_py_url(kombus) == server.url
        publisher = RedisPublisher(kombus, "agenttest")
        try:
            publisher.publish([TaskMessage("agenttest.turn", ("r1", "c1", 2), "x", 0)])
            publisher.publish([TaskMessage("agenttest.turn", ("r1", "c2", 1), "y", 9)])
        finally:
            publisher.close()
        reader = redis.Redis.from_url(server.url)
        assert _comparable(reader.lrange("agenttest", 0, -1)[0])["body"][0] == ["r1", "c1", 2]
        assert _comparable(reader.lrange("agenttest:9", 0, -1)[0])["body"][0] == ["r1", "c2", 1]
    assert redis_py_url("redis://:p%40ss@host:6379/3") == "redis://:p%40ss@host:6379/3"


def test_a_turn_of_a_case_named_beyond_ascii_reaches_the_worker_as_published(
    redis_db: str,
) -> None:
    """The message is UTF-8 JSON (orjson's): kombu's transport, taking it after BRPOP's
    with the script that records it, hands Celery the same arguments, and keeps it in
    the unacked hash as read."""
    from celery import Celery
    from kombu import Consumer, Queue

    from agenttest_worker.fleet.publish import RedisPublisher, TaskMessage
    from agenttest_worker.fleet.transport import use_shared_clients

    client = redis.Redis.from_url(redis_db)
    client.delete("utf8-test", "unacked", "unacked_index")
    cases = ['caf\u00e9 \u6771\u4eac \U0001f600 "q"', "plain"]
    RedisPublisher(redis_db, "utf8-test").publish(
        [TaskMessage("agenttest.turn", ("r1", case, 2), repr(("r1", case, 2)), 0) for case in cases]
    )
    assert "\u6771\u4eac".encode() in (client.lindex("utf8-test", 1) or b"")

    use_shared_clients()
    received: list[Any] = []
    with Celery(broker=redis_db).connection_for_write() as connection:
        channel = connection.channel()
        queue = Queue("utf8-test", routing_key="utf8-test")
        consumer = Consumer(channel, [queue], callbacks=[lambda _, m: received.append(m)])
        consumer.qos(prefetch_count=2)
        with consumer:
            connection.drain_events(timeout=2)  # BRPOP's message, and one taken along
            assert [m.decode()[0] for m in received] == [["r1", case, 2] for case in cases]
            for message in received:
                assert message.headers["argsrepr"] == repr(tuple(message.decode()[0]))
                stored = json.loads(client.hget("unacked", message.delivery_tag) or b"null")
                assert stored[0] == message.serializable()
                message.ack()
        channel.close()
