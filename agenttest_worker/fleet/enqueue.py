"""Publishing the fleet's tasks by name: turns, start batches, the aggregation.

Apart from the task bodies (tasks.py) so that a process that only publishes (the
submitter, `resume`) imports the publisher, not the worker's driver, pool and metrics.
On Redis each task goes out as the message Celery writes, in one LPUSH (several in one
pipeline: publish.py), and Celery itself is not imported; on any other broker Celery
publishes it (`send_task`, one producer for a batch). tasks.py registers its tasks
under these names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agenttest_worker.fleet.publish import RedisPublisher, TaskMessage
from agenttest_worker.fleet.queues import CONTINUING, NEW_CONVERSATION
from agenttest_worker.settings import get_settings

if TYPE_CHECKING:
    from agenttest_worker.driver.step import Advance

TURN = "agenttest.turn"
START = "agenttest.start"
AGGREGATE = "agenttest.aggregate"

_publishers: dict[str, RedisPublisher | None] = {}


def _publisher() -> RedisPublisher | None:
    """The Redis publisher of this process's broker, or None on any other broker."""
    settings = get_settings()
    broker = settings.broker_url or ""
    if broker not in _publishers:
        redis = broker.startswith(("redis://", "rediss://"))
        _publishers[broker] = RedisPublisher(broker, settings.queue) if redis else None
    return _publishers[broker]


def connect() -> None:
    """Open the connection tasks are published on (a worker's warm-up, tasks.py)."""
    publisher = _publisher()
    if publisher is not None:
        publisher.client.ping()
        return
    from agenttest_worker.fleet.app import app  # Celery: see the module docstring

    with app.producer_or_acquire() as producer:
        producer.channel  # noqa: B018  (connects)


def _task(name: str, args: tuple[Any, ...], priority: int) -> TaskMessage:
    # The arguments' display form (what Flower shows) is written here rather than left
    # to Celery's `saferepr`, which walks the arguments on every publish; the arguments
    # are plain ids and numbers, so `repr` says the same.
    return TaskMessage(name, args, repr(args), priority)


def publish(messages: list[TaskMessage], producer: Any = None) -> None:
    """Publish `messages`: on Redis in one pipeline; elsewhere with Celery's publish
    (`producer` for several calls in a row)."""
    if not messages:
        return
    publisher = _publisher()
    if publisher is not None:
        publisher.publish(messages)
        return
    # Celery: only for a broker other than Redis (see the module docstring).
    from agenttest_worker.fleet.app import app

    with app.producer_or_acquire(producer) as acquired:
        for message in messages:
            app.send_task(
                message.name,
                message.args,
                producer=acquired,
                priority=message.priority,
                argsrepr=message.argsrepr,
                kwargsrepr="{}",
            )


def turn_message(run_id: str, case_id: str, number: int) -> TaskMessage:
    """`agenttest.turn(run_id, case_id, number)`. A first turn waits behind the turns of
    conversations under way (app.py)."""
    priority = NEW_CONVERSATION if number == 1 else CONTINUING
    return _task(TURN, (run_id, case_id, number), priority)


def enqueue_turn(run_id: str, case_id: str, number: int, producer: Any = None) -> None:
    """Publish `agenttest.turn(run_id, case_id, number)`."""
    enqueue_turns(run_id, [(case_id, number)], producer)


def enqueue_turns(run_id: str, turns: list[tuple[str, int]], producer: Any = None) -> None:
    """Publish `agenttest.turn` for each (case_id, number)."""
    publish([turn_message(run_id, case_id, number) for case_id, number in turns], producer)


def start_message(run_id: str, first: int, last: int) -> TaskMessage:
    """`agenttest.start` for the run's cases numbered first..last.

    It starts new conversations, so it waits with their first turns: behind every turn
    of the conversations under way, and in order with the first turns already queued.
    (At the higher priority, the batches a large run's submitter publishes as it stores
    its cases kept every first turn waiting until the last batch was stored.)
    """
    return _task(START, (run_id, first, last), NEW_CONVERSATION)


def enqueue_start(run_id: str, first: int, last: int, producer: Any = None) -> None:
    """Publish `agenttest.start` for the run's cases numbered first..last."""
    publish([start_message(run_id, first, last)], producer)


def enqueue_starts(run_id: str, first: int, last: int) -> None:
    """`agenttest.start` for the conversations first..last, a batch of
    AGENTTEST_ENQUEUE_BATCH per message, all of them published together."""
    size = get_settings().enqueue_batch
    publish(
        [
            start_message(run_id, low, min(low + size - 1, last))
            for low in range(first, last + 1, size)
        ]
    )


def enqueue_aggregate(run_id: str) -> None:
    """Publish `agenttest.aggregate(run_id)`: the run's reports, built once."""
    publish([_task(AGGREGATE, (run_id,), CONTINUING)])


def follow_up(run_id: str, case_id: str, advance: Advance) -> None:
    """Enqueue what the step asked for: the next turn, the conversations it claimed to
    start (a run capped by --parallel), the aggregation."""
    if advance.next_turn is not None:
        enqueue_turn(run_id, case_id, advance.next_turn)
    if advance.starts is not None:
        enqueue_starts(run_id, *advance.starts)
    if advance.run_finished:
        enqueue_aggregate(run_id)
