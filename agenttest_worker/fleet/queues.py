"""The fleet's queues as the broker holds them, and how a publish retries: what the
Celery app is configured with (app.py) and what a process that only publishes needs
(enqueue.py, publish.py), without importing Celery (~0.2 s of a submitter's start-up).
"""

from __future__ import annotations

# Redis priorities (kombu): 0 is popped first. Only these two steps exist, so workers
# watch two lists per queue; ":" keeps the second list's name readable for monitoring
# (deploy/k8s/keda-scaledobject.yaml watches both).
CONTINUING = 0
NEW_CONVERSATION = 9
PRIORITY_STEPS = (CONTINUING, NEW_CONVERSATION)
PRIORITY_SEPARATOR = ":"


def queue_lists(queue: str) -> list[str]:
    """The Redis lists holding `queue`'s messages, the first popped first."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS]


def queue_list(queue: str, priority: int) -> str:
    """The Redis list kombu's transport pushes a message of `priority` onto (its
    `_q_for_pri`: the highest priority step not above it)."""
    clamped = max(min(priority, 9), 0)
    steps = [step for step in PRIORITY_STEPS if step <= clamped]
    return queue_lists(queue)[len(steps) - 1]


# A publish that cannot reach the broker tries again after 0.2 s, then 0.5 s longer
# each time up to 3 s, 10 times: about 20 s in all (Celery's `task_publish_retry_policy`,
# and the Redis publisher's own loop). What is still not published then, the sweeper
# re-enqueues from the store (sweeper.py).
PUBLISH_RETRY_POLICY = {
    "max_retries": 10,
    "interval_start": 0.2,
    "interval_step": 0.5,
    "interval_max": 3,
}
