"""The Celery application and its configuration, nothing else.

Reliability choices (DESIGN.md "Distribution"): tasks are acknowledged after they
finish (`acks_late`) and given back when a worker dies (`reject_on_worker_lost`); each
worker process reserves one message at a time (prefetch 1), so a slow conversation
never holds others hostage; Redis redelivers an unacknowledged message only after a
visibility timeout longer than the longest turn (AGENTTEST_VISIBILITY_TIMEOUT).
No result backend: results live in the store, and nothing waits on task results.
"""

from __future__ import annotations

from celery import Celery

from agenttest_worker.settings import get_settings

settings = get_settings()

app = Celery(
    "agenttest_worker",
    broker=settings.broker_url or "memory://",
    include=["agenttest_worker.tasks"],
)
app.conf.update(
    task_default_queue=settings.queue,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    broker_transport_options={
        "visibility_timeout": settings.visibility_timeout,
        # Redis connection hiccups are retried instead of failing the publish.
        "max_retries": 10,
        "interval_start": 0.2,
        "interval_step": 0.5,
        "interval_max": 3,
    },
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    task_publish_retry=True,
    task_publish_retry_policy={
        "max_retries": 10,
        "interval_start": 0.2,
        "interval_step": 0.5,
        "interval_max": 3,
    },
    # Flower and `celery events` show tasks as they happen.
    worker_send_task_events=True,
    task_send_sent_event=True,
    worker_hijack_root_logger=False,
)
