"""Workers that are gone give their messages back at once (a Redis broker).

RabbitMQ gives a worker's unacknowledged messages back as soon as its connection
closes. Redis cannot know a worker died: it gives them back after the visibility
timeout (AGENTTEST_VISIBILITY_TIMEOUT, an hour by default, as it must stay above the
longest turn), and the stall sweeper re-enqueues a conversation only once its whole run
stopped moving, which other workers' turns prevent. So a worker killed mid-turn held
its conversations for an hour.

Instead every worker process that consumes (its Celery main process) says it is alive
in Redis, and which messages it holds:

- `agenttest:worker:<id>`: set every second by a thread of its own
  (`agenttest-presence`), and expiring after AGENTTEST_WORKER_GONE_SECONDS; `<id>` is
  the worker's name and process id with a random part, so that a restarted worker is
  never taken for the dead one;
- `agenttest:worker-held:<id>`: the delivery tags of the messages it has received and
  not yet acknowledged (Celery's `task_received`; the tags kombu has since removed
  from its unacked hash, acknowledged, are dropped at the next tick);
- `agenttest:workers`: every worker id that has one.

The sweeper thread of every worker (sweeper.py) looks each second for ids whose
presence has expired; the first to take a gone worker's held set (a transaction: one
sweeper gets it) gives each of its messages back to the queue at once through kombu's
own `restore_by_tag`, as the visibility timeout would have an hour later. The turn is
then played again by another worker; what the dead one recorded stays recorded, and
the guarded save refuses to record anything twice. A restored message is marked
redelivered, so its turn runs alone (isolation.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from typing import Any

from celery.signals import task_received, worker_ready, worker_shutdown

from agenttest_worker.fleet.celery_app import REDIS_BROKER, app
from agenttest_worker.settings import get_settings

log = logging.getLogger("agenttest.tasks")

WORKERS_KEY = "agenttest:workers"
PRESENCE_KEY = "agenttest:worker:{id}"
HELD_KEY = "agenttest:worker-held:{id}"
# Beats between two writes of the held set when it did not change.
REWRITE_EVERY = 10


class Presence:
    """This worker process's presence and the messages it holds."""

    def __init__(self, name: str) -> None:
        self.id = f"{name}:{os.getpid()}:{secrets.token_hex(3)}"
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._written: set[str] | None = None
        self._beats = 0

    def received(self, tag: str) -> None:
        with self._lock:
            self._held.add(tag)

    def beat(self, gone_seconds: float) -> None:
        """Say this worker is alive, and write the messages it holds when they changed
        (those acknowledged since the last beat dropped first)."""
        with self._lock:
            held = set(self._held)
        with app.producer_or_acquire() as producer:
            channel: Any = producer.channel
            client = channel.client
            if held:
                # kombu removes a message from its unacked hash when it is acknowledged.
                tags = sorted(held)
                still = client.hmget(channel.unacked_key, tags)
                acked = {tag for tag, there in zip(tags, still, strict=True) if there is None}
                if acked:
                    with self._lock:
                        self._held -= acked
                    held -= acked
            held_key = HELD_KEY.format(id=self.id)
            with client.pipeline(transaction=True) as pipe:
                pipe.set(PRESENCE_KEY.format(id=self.id), "1", px=int(gone_seconds * 1000))
                pipe.sadd(WORKERS_KEY, self.id)
                # Written again now and then besides when it changed: a sweeper that took
                # this worker for gone (a pause longer than the gone period) deleted it.
                if held != self._written or self._beats % REWRITE_EVERY == 0:
                    pipe.delete(held_key)
                    if held:
                        pipe.sadd(held_key, *held)
                pipe.execute()
            self._written = held
            self._beats += 1

    def leave(self) -> None:
        """A worker shutting down warmly has finished or given back what it held."""
        with app.producer_or_acquire() as producer:
            client = producer.channel.client
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(PRESENCE_KEY.format(id=self.id), HELD_KEY.format(id=self.id))
                pipe.srem(WORKERS_KEY, self.id)
                pipe.execute()


def restore_gone_workers(own_id: str | None = None) -> dict[str, int]:
    """Give back at once the messages held by workers whose presence expired: {worker
    id: messages given back}, for those this call took (one sweeper takes each)."""
    restored: dict[str, int] = {}
    with app.producer_or_acquire() as producer:
        channel: Any = producer.channel
        client = channel.client
        for raw in client.smembers(WORKERS_KEY):
            worker = raw.decode() if isinstance(raw, bytes) else str(raw)
            if worker == own_id or client.exists(PRESENCE_KEY.format(id=worker)):
                continue
            with client.pipeline(transaction=True) as pipe:
                pipe.smembers(HELD_KEY.format(id=worker))
                pipe.delete(HELD_KEY.format(id=worker))
                pipe.srem(WORKERS_KEY, worker)
                held, _, taken = pipe.execute()
            if not taken:
                continue  # another sweeper took it
            for tag in held:
                channel.qos.restore_by_tag(tag.decode() if isinstance(tag, bytes) else tag)
            restored[worker] = len(held)
    return restored


# How often a worker marks itself present and writes what it holds.
BEAT_SECONDS = 1.0


class PresenceBeat(threading.Thread):
    """The worker's thread marking it present: apart from the marks of waiting turns
    (liveness.py), so that neither delays the other."""

    def __init__(self, presence: Presence, gone_seconds: float) -> None:
        super().__init__(name="agenttest-presence", daemon=True)
        self.presence = presence
        self.gone_seconds = gone_seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(min(BEAT_SECONDS, self.gone_seconds / 3)):
            try:
                self.presence.beat(self.gone_seconds)
            except Exception as exc:  # the broker is away: next beat
                log.warning("could not mark this worker present; retrying: %s", exc)


_presence: Presence | None = None
_beat: PresenceBeat | None = None


def current() -> Presence | None:
    """This worker process's presence (None: not a worker on a Redis broker)."""
    return _presence


@worker_ready.connect
def _arrive(sender: Any = None, **_: Any) -> None:
    global _presence, _beat
    settings = get_settings()
    if not settings.distributed or not REDIS_BROKER or _presence is not None:
        return
    _presence = Presence(str(getattr(sender, "hostname", None) or socket.gethostname()))
    _beat = PresenceBeat(_presence, settings.worker_gone_seconds)
    _beat.start()


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    presence = _presence
    message = getattr(request, "message", None)
    if presence is not None and message is not None and message.delivery_tag:
        presence.received(str(message.delivery_tag))


@worker_shutdown.connect
def _leave(**_: Any) -> None:
    if _beat is not None:
        _beat.stopping.set()
        _beat.join(timeout=5)  # (so that no beat marks it present again after it left)
    if _presence is not None:
        try:
            _presence.leave()
        except Exception as exc:  # the broker is away: the mark expires on its own
            log.warning("could not remove this worker's presence mark: %s", exc)
