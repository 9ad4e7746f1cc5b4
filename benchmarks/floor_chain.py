"""The floor for distributed throughput: a bare Celery chain, nothing else.

One task per turn: one httpx call to the agent, one Postgres insert, enqueue the next
turn. Threads pool, same concurrency as agenttest's workers. This is the least any
Celery-based runner must do per turn; benchmarks/throughput.py compares against it.

    BENCH_BROKER=redis://... BENCH_DB=postgresql://... BENCH_AGENT=http://.../v1 \
        celery -A benchmarks.floor_chain worker --pool threads --concurrency 100
"""

from __future__ import annotations

import os
import threading

import httpx
import psycopg
from celery import Celery

app = Celery("floor", broker=os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/13"))
app.conf.update(
    task_default_queue="floor",
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
)

_local = threading.local()
_client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=200))


def _db() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = psycopg.connect(os.environ["BENCH_DB"], autocommit=True)
        _local.conn = conn
    return conn


@app.task(name="floor.turn")
def turn(conversation: str, number: int, turns: int) -> None:
    reply = _client.post(
        os.environ["BENCH_AGENT"] + "/chat/completions",
        json={"model": "bench", "messages": [{"role": "user", "content": f"turn {number}"}]},
    ).json()
    _db().execute(
        "INSERT INTO floor_turns (conversation, turn, output) VALUES (%s, %s, %s)",
        (conversation, number, reply["choices"][0]["message"]["content"]),
    )
    if number < turns:
        turn.apply_async((conversation, number + 1, turns))
