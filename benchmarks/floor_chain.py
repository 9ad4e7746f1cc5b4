"""The floor for distributed throughput: a bare Celery chain, nothing else.

One task per turn: one httpx call to the agent, one Postgres insert (from a pool of 20
connections per process, like agenttest's), enqueue the next turn. Threads pool, same
concurrency as agenttest's workers. This is the least any Celery-based runner must do
per turn; benchmarks/throughput.py compares against it.

    BENCH_BROKER=redis://... BENCH_DB=postgresql://... BENCH_AGENT=http://.../v1 \
        celery -A benchmarks.floor_chain worker --pool threads --concurrency 100
"""

from __future__ import annotations

import os
import queue
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

_client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=200))

# At most POOL_SIZE connections per worker process, as agenttest's engine has
# (store/sql/db.py): one per thread would take a hundred per process, and two processes
# would run out of Postgres's default 100 connections (the chain then stalls on turns
# whose insert failed).
POOL_SIZE = 20
_slots = threading.BoundedSemaphore(POOL_SIZE)
_free: queue.SimpleQueue[psycopg.Connection] = queue.SimpleQueue()


def _insert(conversation: str, number: int, output: str) -> None:
    with _slots:
        try:
            conn = _free.get_nowait()
        except queue.Empty:
            conn = psycopg.connect(os.environ["BENCH_DB"], autocommit=True)
        try:
            conn.execute(
                "INSERT INTO floor_turns (conversation, turn, output) VALUES (%s, %s, %s)",
                (conversation, number, output),
            )
        finally:
            _free.put(conn)


@app.task(name="floor.turn")
def turn(conversation: str, number: int, turns: int) -> None:
    reply = _client.post(
        os.environ["BENCH_AGENT"] + "/chat/completions",
        json={"model": "bench", "messages": [{"role": "user", "content": f"turn {number}"}]},
    ).json()
    _insert(conversation, number, reply["choices"][0]["message"]["content"])
    if number < turns:
        turn.apply_async((conversation, number + 1, turns))
