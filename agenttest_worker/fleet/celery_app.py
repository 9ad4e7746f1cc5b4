"""The Celery application and its configuration, nothing else.

Reliability choices (DESIGN.md "Distribution"): tasks are acknowledged after they
finish (`acks_late`) and given back when a worker dies (`reject_on_worker_lost`); each
worker process reserves one message at a time (prefetch 1), so a slow conversation
never holds others hostage; Redis redelivers an unacknowledged message only after a
visibility timeout longer than the longest turn (AGENTTEST_VISIBILITY_TIMEOUT),
RabbitMQ as soon as the connection of the worker that held it closes.
No result backend: results live in the store, and nothing waits on task results.
Workers reconnect to a broker that went away for as long as it takes, and a publish
retries for about 20 s; what the broker lost meanwhile (or a publish that gave up) is
re-enqueued from the store (sweeper.py).

Conversations under way go before new ones: a conversation's first turn and the start
batches that publish first turns are published with priority NEW_CONVERSATION,
everything else (later turns, the aggregation) with CONTINUING. Without this a run's
next turns queued behind all of its not-yet-started conversations, and a
conversation's turns were spread over the whole run (hours on a nightly run: long
enough for an agent to forget a session). Celery passes a task's `priority` to the
broker, whose reading differs: kombu's Redis transport keeps a list per priority step
(`agenttest` and `agenttest:9`) and pops the lowest number first; RabbitMQ delivers
the highest first from a queue declared with `x-max-priority`
(`task_queue_max_priority`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from celery.signals import celeryd_init

from agenttest_worker.settings import REDIS_SCHEMES, get_settings

settings = get_settings()

REDIS_BROKER = (settings.broker_url or "").startswith(REDIS_SCHEMES)
if REDIS_BROKER:
    CONTINUING, NEW_CONVERSATION = 0, 9
else:
    CONTINUING, NEW_CONVERSATION = 1, 0

# A publish that cannot reach the broker tries again after 0.2 s, then 0.5 s longer
# each time up to 3 s, 10 times: about 20 s in all. What is still not published then,
# the sweeper re-enqueues from the store (sweeper.py).
PUBLISH_RETRY_POLICY = {
    "max_retries": 10,
    "interval_start": 0.2,
    "interval_step": 0.5,
    "interval_max": 3,
}

# The default pool, named so that importing the app does not import it (Celery loads
# it when the worker starts).
LOOP_POOL = "agenttest_worker.fleet.loop_pool:TaskPool"
# kombu's Redis transport, moving aside what it cannot read instead of dying of it
# (redis_transport.py); named for the same reason.
REDIS_TRANSPORT = "agenttest_worker.fleet.redis_transport:Transport"


class CheckedTask(Task):  # type: ignore[misc]
    """Every task of the app: a message it cannot be built from is an invalid task, logged
    and dropped, not an error that stops the worker (checked_request.py). (Named, so that
    only a worker imports it.)"""

    Request = "agenttest_worker.fleet.checked_request:CheckedRequest"


def _worker_transport(conf: Any = None, **_: Any) -> None:
    """A worker consumes through the transport that moves aside what it cannot read
    (`celeryd_init`, before it connects: Celery's place for settings of workers alone).
    Other processes publish and read through kombu's own, whose URL Flower and the
    exporter read the broker's kind from."""
    if REDIS_BROKER and conf is not None:
        conf.broker_transport = REDIS_TRANSPORT


# Connected by call rather than as a decorator: Celery's signals are untyped (mypy strict).
celeryd_init.connect(_worker_transport)


app = Celery(
    "agenttest_worker",
    task_cls=CheckedTask,
    broker=settings.broker_url or "memory://",
    include=["agenttest_worker.fleet.tasks", "agenttest_worker.fleet.sweeper"],
)
if settings.celery_config:
    # Celery keeps what the code sets (below) over what this module sets.
    app.config_from_object(settings.celery_config)
app.conf.update(
    task_default_queue=settings.queue,
    # (RabbitMQ: the queues are declared with x-max-priority 1; ignored on Redis.)
    task_queue_max_priority=None if REDIS_BROKER else 1,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    # Turns wait on agents, not on the CPU: coroutines on one event loop per process,
    # thousands of them (loop_pool.py). `--pool threads` and `--pool processes` remain.
    worker_pool=LOOP_POOL,
    worker_concurrency=settings.worker_concurrency,
    broker_transport_options={
        # Redis: two lists per queue; ":" keeps the second one's name readable for
        # monitoring (deploy/k8s/keda-scaledobject.yaml watches both); the same as
        # redis_transport.PRIORITY_SEP.
        "priority_steps": [0, 9],
        "sep": ":",
        "visibility_timeout": settings.visibility_timeout,
        # Sweep for messages of dead workers every restore_interval seconds.
        "unacked_restore_interval": settings.restore_interval,
        "unacked_restore_throttle": 1,
        # RabbitMQ (py-amqp): a publish returns once the broker has the message. The
        # next turn is published before its turn's message is acknowledged, but on
        # another connection: unconfirmed, the acknowledgment could arrive first and the
        # broker hand out a new conversation before the conversation under way. (Redis
        # ignores it: its LPUSH has landed when it returns.)
        "confirm_publish": True,
        # Redis connection hiccups are retried instead of failing the publish.
        "max_retries": 10,
        "interval_start": 0.2,
        "interval_step": 0.5,
        "interval_max": 3,
    },
    broker_connection_retry_on_startup=True,
    broker_connection_retry=True,
    broker_connection_max_retries=None,
    # When the broker connection drops, let the turns in flight finish: each saves its
    # step to the store and publishes the next turn (the publish retries while the
    # broker is away). Cancelling them would only throw that work away; their lost
    # acknowledgment means at most a redelivery, which the turn guard makes a no-op.
    worker_cancel_long_running_tasks_on_connection_loss=False,
    task_publish_retry=True,
    task_publish_retry_policy=PUBLISH_RETRY_POLICY,
    # Flower and `celery events` show tasks as they are sent, and as workers receive,
    # start and finish them. Off unless asked for: each is a broker message per turn
    # whether anyone watches or not, and Flower turns the workers' own on in the
    # workers it watches (an `enable_events` control command every few seconds).
    worker_send_task_events=settings.task_events,
    task_send_sent_event=settings.task_events,
    worker_hijack_root_logger=False,
)


def sweep_interval(stall_seconds: float) -> float:
    """A few sweeps per stall period: a loss is noticed within about 1.3 stall periods."""
    return min(max(stall_seconds / 3, 1.0), 60.0)


# For fleets that prefer one sweeper to one per worker: `celery -A agenttest_worker beat`
# sends `agenttest.sweep` on this schedule (sweeper.py).
_sweep_every = sweep_interval(settings.stall_seconds)
app.conf.beat_schedule = {
    "agenttest-sweep": {
        "task": "agenttest.sweep",
        "schedule": _sweep_every,
        # A sweep not picked up before the next one is due is redundant.
        "options": {"expires": _sweep_every},
    }
}
