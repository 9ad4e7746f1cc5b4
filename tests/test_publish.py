"""Turn tasks published on Redis in one LPUSH (fleet/publish.py) are the messages
Celery's `apply_async` writes, on the list kombu's transport would choose: compared
field by field against Celery's own, in a process whose app uses a real Redis broker.
On any other broker Celery publishes them itself."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

import redis

PUBLISHING = """
from agenttest_worker.fleet.tasks import enqueue_turn, enqueue_turns, turn
# Celery's own message, as enqueue_turn published it before (fleet/tasks.py).
turn.apply_async(("r1", "c1", 2), priority=0, argsrepr="('r1', 'c1', 2)", kwargsrepr="{}")
enqueue_turn("r1", "c1", 2)
enqueue_turns("r1", [("c2", 1), ("c3", 1)])
turn.apply_async(("r1", "c9", 1), priority=9, argsrepr="('r1', 'c9', 1)", kwargsrepr="{}")
"""

# Fields that differ between any two messages: each task's id and delivery tag.
_PER_MESSAGE = {("headers", "id"), ("headers", "root_id"), ("properties", "correlation_id")}


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
        assert message[part][key], (part, key)
        message[part][key] = "(per message)"
    assert message["headers"]["root_id"] != message["properties"]["delivery_tag"]
    message["properties"]["delivery_tag"] = "(per message)"
    return message


def test_a_published_turn_is_the_message_celery_writes(redis_db: str) -> None:
    _publish(redis_db)
    client = redis.Redis.from_url(redis_db)
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


OTHER_BROKER = """
import json
from agenttest_worker.fleet.tasks import app, enqueue_turns
enqueue_turns("r1", [("c1", 2), ("c2", 1)])
with app.connection_for_read() as connection:
    queue = connection.SimpleQueue("agenttest")
    got = []
    for _ in range(2):
        message = queue.get(timeout=5)
        got.append([message.headers["task"], message.payload[0], message.properties["priority"]])
        message.ack()
print(json.dumps(got))
"""


def test_on_another_broker_turns_are_published_by_celery() -> None:
    env = {**os.environ, "AGENTTEST_BROKER_URL": "memory://", "AGENTTEST_QUEUE": "agenttest"}
    done = subprocess.run(
        [sys.executable, "-c", OTHER_BROKER], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(got) == [
        ["agenttest.turn", ["r1", "c1", 2], 0],
        ["agenttest.turn", ["r1", "c2", 1], 9],
    ]
