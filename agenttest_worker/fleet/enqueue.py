"""Publishing the fleet's tasks by name: turns, start batches, the aggregation.

Apart from the task bodies (tasks.py) so that a process that only publishes (the
submitter, `resume`) imports the app, not the worker's driver, pool and metrics.
Every task goes out through Celery (`send_task`), on every broker alike: the app's
`task_routes`, serializer and compression, its publish retry policy, the publish
signals and `task-sent` events all apply. A batch of messages shares one producer.
tasks.py registers its tasks under these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agenttest_worker.fleet.celery_app import CONTINUING, NEW_CONVERSATION, app
from agenttest_worker.settings import get_settings

if TYPE_CHECKING:
    from agenttest_worker.driver.step import Advance

TURN = "agenttest.turn"
START = "agenttest.start"
AGGREGATE = "agenttest.aggregate"


@dataclass(frozen=True)
class TaskMessage:
    """One task to publish: its name, positional arguments (plain ids and numbers) and
    its priority (celery_app.py)."""

    name: str
    args: tuple[Any, ...]
    priority: int


def connect() -> None:
    """Open the connection tasks are published on (a worker's warm-up, tasks.py)."""
    with app.producer_or_acquire() as producer:
        producer.channel  # noqa: B018  (connects)


def publish(messages: list[TaskMessage], producer: Any = None) -> None:
    """Publish `messages` through one producer (`producer` when given, for several calls
    in a row)."""
    if not messages:
        return
    with app.producer_or_acquire(producer) as acquired:
        for message in messages:
            # add_to_parent=False: a start batch would otherwise keep every first turn it
            # publishes among its task's children, with no result backend to keep them for.
            app.send_task(
                message.name,
                message.args,
                producer=acquired,
                priority=message.priority,
                add_to_parent=False,
            )


def turn_message(run_id: str, case_id: str, number: int) -> TaskMessage:
    """`agenttest.turn(run_id, case_id, number)`. A first turn waits behind the turns of
    conversations under way (celery_app.py)."""
    priority = NEW_CONVERSATION if number == 1 else CONTINUING
    return TaskMessage(TURN, (run_id, case_id, number), priority)


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
    return TaskMessage(START, (run_id, first, last), NEW_CONVERSATION)


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
    publish([TaskMessage(AGGREGATE, (run_id,), CONTINUING)])


def follow_up(run_id: str, case_id: str, advance: Advance) -> None:
    """Enqueue what the step asked for: the next turn, the conversations it claimed to
    start (a run capped by --parallel), the repetition it added (--repeat auto), the
    aggregation."""
    if advance.next_turn is not None:
        enqueue_turn(run_id, case_id, advance.next_turn)
    if advance.starts is not None:
        enqueue_starts(run_id, *advance.starts)
    if advance.added is not None:
        enqueue_turn(run_id, advance.added, 1)
    if advance.run_finished:
        enqueue_aggregate(run_id)
