"""Publishing turn tasks on a Redis broker: Celery's message, pushed in one command.

A fleet publishes one message per turn (the next turn, saved by the one before), and
`Task.apply_async` spent ~400 µs of CPU on each (signature options, routing, the
producer pool, kombu's message preparation and the retry wrapper around one LPUSH),
about a tenth of a worker's CPU per turn (benchmarks/throughput.py). On Redis the
message is instead built here, as Celery's task protocol 2 writes it (the same headers,
properties and body, so workers, Flower and `celery inspect` see the same task), and
pushed onto the list kombu's Redis transport would have chosen for its priority, with
the publish retry policy the app configures (queues.py). Several messages (a start
batch's first turns) go in one pipeline.

Neither Celery nor kombu is imported here: the submitter publishes its run's start
without importing them (~0.2 s of its start-up, which the first conversation waited
for). The client is redis-py's, on the broker's URL as redis-py reads it (the same
`redis://` and `rediss://` URLs; `?ssl_cert_reqs=` in kombu's spellings too), kept for
the process.

Any other broker is published to through `apply_async`, unchanged.
`tests/test_publish.py` holds the message to what `apply_async` writes, field by field,
so an upgrade of Celery or kombu that changes it fails there.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agenttest_worker.fleet.queues import PUBLISH_RETRY_POLICY, queue_list
from agenttest_worker.settings import redis_py_url

log = logging.getLogger("agenttest.tasks")

# The part of a task's body after its arguments: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

# Its connections' name in Redis's CLIENT LIST: where the turns are published from.
PUBLISHER_NAME = "agenttest-publisher"

# What kombu's Redis channel sets on its connections beyond the URL's own settings:
# a connection idle this long is checked before it is used again.
_HEALTH_CHECK_SECONDS = 25


def _waits(policy: dict[str, float]) -> tuple[float, ...]:
    """The waits between a publish's attempts under Celery's retry `policy`: from
    interval_start, interval_step longer each time up to interval_max."""
    waits, wait = [], policy["interval_start"]
    for _ in range(int(policy["max_retries"])):
        waits.append(wait)
        wait = min(wait + policy["interval_step"], policy["interval_max"])
    return tuple(waits)


_PUBLISH_WAITS = _waits(PUBLISH_RETRY_POLICY)


@dataclass(frozen=True)
class TaskMessage:
    """One task to publish: its name, positional arguments (plain ids and numbers),
    their display form (what Flower shows) and its priority."""

    name: str
    args: tuple[Any, ...]
    argsrepr: str
    priority: int


def origin() -> str:
    """The publishing process, as Celery names one that is not a worker (its
    `anon_nodename`): gen<pid>@<host>."""
    return f"gen{os.getpid()}@{socket.gethostname()}"


def encode(task: TaskMessage, queue: str, origin: str, reply_to: str) -> bytes:
    """The JSON text of `task` as kombu stores it in the queue's Redis list, in UTF-8.

    Written by orjson: a worker publishes every next turn, and a turn's message took
    15.1 us with json.dumps, 6.4 us so (~1% of a turn's CPU); kombu reads any JSON, and
    orjson's is compact and leaves non-ASCII text as UTF-8, which kombu decodes."""
    task_id = str(uuid.uuid4())
    body = orjson.dumps([list(task.args), {}, _EMBED])
    message = {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task.name,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": task.argsrepr,
            "kwargsrepr": "{}",
            "origin": origin,
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": reply_to,
            "argsrepr": task.argsrepr,
            "kwargsrepr": "{}",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": task.priority,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return orjson.dumps(message)


class RedisPublisher:
    """Pushes task messages onto a Redis broker's queue lists (see the module docstring).

    Safe to share between threads: every command takes a connection from the client's
    pool."""

    def __init__(self, broker_url: str, queue: str) -> None:
        self.client = redis.Redis.from_url(
            redis_py_url(broker_url),
            health_check_interval=_HEALTH_CHECK_SECONDS,
            socket_keepalive=True,
            client_name=PUBLISHER_NAME,
        )
        self.queue = queue
        self.origin = origin()
        # Where a reply would go (Celery's `reply_to`, one per publishing thread there);
        # no task here has a result, so one per process says as much.
        self.reply_to = str(uuid.uuid4())

    def publish(self, tasks: Sequence[TaskMessage]) -> None:
        """Push every task (one pipeline for several), retrying a lost connection with
        the app's publish retry policy; the last error is raised (what the broker never
        got, the sweeper re-enqueues from the store)."""
        pushes = [
            (queue_list(self.queue, t.priority), encode(t, self.queue, self.origin, self.reply_to))
            for t in tasks
        ]
        for wait in (*_PUBLISH_WAITS, None):
            try:
                self._push(pushes)
                return
            # (A command that lost its connection; a connection that could not be made.)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if wait is None:
                    raise
                log.warning("publishing %d task(s) failed (%s); retrying", len(pushes), exc)
                time.sleep(wait)

    def _push(self, pushes: list[tuple[str, bytes]]) -> None:
        if len(pushes) == 1:
            self.client.lpush(*pushes[0])
            return
        with self.client.pipeline(transaction=False) as pipe:
            for key, text in pushes:
                pipe.lpush(key, text)
            pipe.execute()

    def close(self) -> None:
        self.client.close()
