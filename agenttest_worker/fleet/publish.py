"""Publishing turn tasks on a Redis broker: Celery's message, pushed in one command.

A fleet publishes one message per turn (the next turn, saved by the one before), and
`Task.apply_async` spent ~400 µs of CPU on each (signature options, routing, the
producer pool, kombu's message preparation and the retry wrapper around one LPUSH),
about a tenth of a worker's CPU per turn (benchmarks/throughput.py). On Redis the
message is instead built here, as Celery's task protocol 2 writes it (the same headers,
properties and body, so workers, Flower and `celery inspect` see the same task), and
pushed onto the list kombu's Redis transport would have chosen for its priority, with
the publish retry policy the app configures (fleet/app.py). Several messages (a start
batch's first turns) go in one pipeline.

Any other broker is published to through `apply_async`, unchanged.
`tests/test_publish.py` holds the message to what `apply_async` writes, field by field,
so an upgrade of Celery or kombu that changes it fails there.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.utils.functional import retry_over_time
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agenttest_worker.fleet.app import PRIORITY_STEPS, queue_lists

log = logging.getLogger("agenttest.tasks")

# The part of a task's body after its arguments: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@dataclass(frozen=True)
class TaskMessage:
    """One task to publish: its name, positional arguments (plain ids and numbers),
    their display form (what Flower shows) and its priority."""

    name: str
    args: tuple[Any, ...]
    argsrepr: str
    priority: int


def queue_list(queue: str, priority: int) -> str:
    """The Redis list kombu's transport pushes a message of `priority` onto (its
    `_q_for_pri`: the highest priority step not above it)."""
    clamped = max(min(priority, 9), 0)
    steps = [step for step in PRIORITY_STEPS if step <= clamped]
    return queue_lists(queue)[len(steps) - 1]


def encode(task: TaskMessage, queue: str, origin: str, reply_to: str) -> str:
    """The JSON text of `task` as kombu stores it in the queue's Redis list."""
    task_id = str(uuid.uuid4())
    body = json.dumps([list(task.args), {}, _EMBED])
    message = {
        "body": base64.b64encode(body.encode()).decode("ascii"),
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
    return json.dumps(message)


class RedisPublisher:
    """Pushes task messages onto a Redis broker's queue lists (see the module docstring)."""

    def __init__(self, app: Celery, queue: str) -> None:
        self.app = app
        self.queue = queue
        self.origin = anon_nodename()
        policy = app.conf.task_publish_retry_policy or {}
        self.max_retries = int(policy.get("max_retries", 3))
        self.interval_start = float(policy.get("interval_start", 0))
        self.interval_step = float(policy.get("interval_step", 0.2))
        self.interval_max = float(policy.get("interval_max", 1))

    def publish(self, tasks: Sequence[TaskMessage]) -> None:
        """Push every task (one pipeline for several), retrying a lost connection with
        the app's publish retry policy; the last error is raised (what the broker never
        got, the sweeper re-enqueues from the store)."""
        reply_to = str(self.app.thread_oid)
        pushes = [
            (queue_list(self.queue, t.priority), encode(t, self.queue, self.origin, reply_to))
            for t in tasks
        ]

        def retrying(exc: Exception, intervals: Iterator[float], _: int) -> float:
            log.warning("publishing %d task(s) failed (%s); retrying", len(pushes), exc)
            return next(intervals)

        # kombu's retry loop, which Celery's own publish retries with (Connection.ensure).
        retry_over_time(  # type: ignore[no-untyped-call]
            self._push,
            # (A command that lost its connection; a connection kombu could not make.)
            (RedisConnectionError, RedisTimeoutError, KombuOperationalError),
            (pushes,),
            errback=retrying,
            max_retries=self.max_retries,
            interval_start=self.interval_start,
            interval_step=self.interval_step,
            interval_max=self.interval_max,
        )

    def _push(self, pushes: list[tuple[str, str]]) -> None:
        with self.app.producer_or_acquire() as producer:
            channel: Any = producer.channel
            with channel.conn_or_acquire() as client:
                if len(pushes) == 1:
                    client.lpush(*pushes[0])
                    return
                with client.pipeline(transaction=False) as pipe:
                    for key, text in pushes:
                        pipe.lpush(key, text)
                    pipe.execute()
