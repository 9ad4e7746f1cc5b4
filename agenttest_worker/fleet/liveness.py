"""Turns that wait are alive: a worker marks its waiting turns so that nobody takes
them for lost ones.

Two things on a fleet presume a turn lost when it has been quiet too long: Redis hands
an unacknowledged message to another worker after AGENTTEST_VISIBILITY_TIMEOUT (the
turn's worker died, presumably), and the sweeper re-enqueues the conversations of a run
none of whose conversations moved for AGENTTEST_STALL_SECONDS (the broker lost them,
presumably). A turn waiting for a rate-limit slot, or out a 429's Retry-After, or to
run alone after a crash (isolation.py), is neither: handed out again, it was played
twice, calling its agents twice (the copy's save is refused, but the calls were made).

So while a turn waits (agents/limits/waiting.py lists it), its worker's heartbeat thread marks
it alive every `marking_interval`: in the store, by touching its conversation's
`updated_at` (what the stall sweeper and `resume` judge by), and at the broker, by
moving its message's entry in kombu's unacked index (a sorted set scored by delivery
time, which the restore sweep compares with the visibility timeout) to now. A turn
that waits less than a tick is never marked: the hot path pays nothing. A worker that
dies stops marking, so its turns are redelivered and re-enqueued as before.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from agenttest_worker.agents.limits.waiting import WAITING
from agenttest_worker.fleet.celery_app import REDIS_BROKER, app
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import recovery

log = logging.getLogger("agenttest.tasks")


@dataclass(frozen=True)
class TurnInFlight:
    """A turn task as its worker runs it: what to mark alive while it waits."""

    run_id: str
    case_id: str
    turn: int
    # kombu's tag for the message (its key in the unacked index); None off Redis.
    delivery_tag: str | None


def marking_interval(visibility_timeout: float, stall_seconds: float) -> float:
    """How often a waiting turn is marked: four times within the shorter of the two
    periods it must not look quiet for (and at least every minute)."""
    return min(max(min(visibility_timeout, stall_seconds) / 4, 0.5), 60.0)


def mark_alive(url: str, turns: list[TurnInFlight]) -> None:
    """Mark `turns` alive in the store and at the broker (see the module docstring)."""
    recovery.mark_alive(url, [(t.run_id, t.case_id, t.turn) for t in turns])
    tags = [t.delivery_tag for t in turns if t.delivery_tag]
    if not tags or not REDIS_BROKER:
        return  # (an AMQP broker redelivers only what a closed connection held)
    now = time.time()  # kombu scores the index with the worker's clock too
    with app.producer_or_acquire() as producer:
        channel: Any = producer.channel
        # XX: only messages still unacknowledged (one acked meanwhile stays gone). The
        # index is kombu's `unacked_index_key` transport option.
        channel.client.zadd(channel.unacked_index_key, dict.fromkeys(tags, now), xx=True)


class Heartbeat(threading.Thread):
    """The worker's thread marking its waiting turns alive."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(name="agenttest-heartbeat", daemon=True)
        self.url = url
        self.interval = interval
        # Checked this often: a turn waiting longer than one tick is marked at the next.
        self.tick = min(interval, 1.0)
        self.stopping = threading.Event()
        self._marked: dict[object, float] = {}

    def beat(self) -> None:
        now = time.monotonic()
        waiting = [t for t in WAITING.waiting_since(now - self.tick) if isinstance(t, TurnInFlight)]
        last = self._marked
        due = [t for t in waiting if t not in last or now - last[t] >= self.interval]
        self._marked = {t: last[t] for t in waiting if t in last}
        if due:
            mark_alive(self.url, due)
            self._marked.update(dict.fromkeys(due, now))

    def run(self) -> None:
        while not self.stopping.wait(self.tick):
            try:
                self.beat()
            except Exception as exc:  # the database or the broker is away: next tick
                log.warning("could not mark waiting turns alive; retrying: %s", exc)


_heartbeat: Heartbeat | None = None


@worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    global _heartbeat
    settings = get_settings()
    if not settings.distributed or _heartbeat is not None:
        return
    interval = marking_interval(settings.visibility_timeout, settings.stall_seconds)
    _heartbeat = Heartbeat(settings.effective_database_url(), interval)
    _heartbeat.start()


@worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stopping.set()
