"""What Postgres spends storing a step of a long conversation, by how the state is stored.

    python -m benchmarks.state_update --turns 3 48 118 --steps 1200

A step of a running conversation stores its state. Stored whole, the state holds every
message of the conversation (what its agent is sent every turn), so that the step's
`UPDATE` carries a document that grows with each turn, which Postgres checks as JSON,
compresses and logs. Stored apart (driver/state_cache.py, migration 0011), the state
holds only the last turn's messages and the step stores the messages added since with
the turn record it inserts anyway (the turn that left the state), once. For each
conversation length this measures, on a table of 60 conversations updated in turn as a
run's steps update them, the server's CPU (its backend process's, from /proc) and
write-ahead log per step, each way, a step being one statement as the hot path's. The
floor is the whole state's step at the first length, in the same run.

Messages are those of benchmarks/fixed_agent.py with `--reply-chars` (a phrase
repeated, which compresses well: a real agent's replies make the whole state's figures
larger). Needs PostgreSQL at 127.0.0.1:5432 (user postgres).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg

from benchmarks.fixed_agent import reply
from benchmarks.throughput import database, process_cpu_seconds, wal_bytes

CONVERSATIONS = 60
SCHEMA = """
CREATE TABLE cases (id int PRIMARY KEY, state json);
CREATE TABLE turn_records (
    id int, position int, record text NOT NULL, messages text, PRIMARY KEY (id, position)
);
INSERT INTO cases SELECT g, '{}' FROM generate_series(0, 59) g;
"""


def _messages(turns: int, reply_chars: int) -> list[dict[str, Any]]:
    answer = json.loads(reply(reply_chars))["choices"][0]["message"]["content"]
    messages: list[dict[str, Any]] = []
    for n in range(1, turns + 1):
        messages.append({"role": "user", "content": f"message {n} of the conversation"})
        messages.append({"role": "assistant", "content": answer})
    return messages


def _state(messages: list[dict[str, Any]], apart: int | None) -> str:
    document: dict[str, Any] = {"case_id": "c", "messages": messages, "phase": "ready"}
    if apart is not None:
        document["earlier_messages"] = apart
    return json.dumps(document)


def _measure(
    conn: psycopg.Connection[Any], steps: int, step: Callable[[int], None]
) -> tuple[float, float]:
    """(ms of the backend's CPU, KB of write-ahead log) per step."""
    pid = conn.info.backend_pid
    wal, cpu = wal_bytes(conn), process_cpu_seconds(pid)
    for i in range(steps):
        step(i)
    cpu_ms = (process_cpu_seconds(pid) - cpu) / steps * 1000
    wal_kb = (wal_bytes(conn) - wal) / steps / 1024
    return cpu_ms, wal_kb


# A step in one statement, as the hot path's (store/sql/turn_statements.py pg_step): the
# state updated, and the turn that left it inserted as a record.
STEP = """
WITH moved AS (UPDATE cases SET state = %(state)s WHERE id = %(id)s RETURNING id)
INSERT INTO turn_records SELECT id, %(position)s, %(record)s, %(messages)s FROM moved
"""
_positions = iter(range(1, 1 << 62))


def _step(
    conn: psycopg.Connection[Any], i: int, state: str, record: str, messages: str | None
) -> None:
    values = {"state": state, "id": i % CONVERSATIONS, "position": next(_positions)}
    conn.execute(STEP, {**values, "record": record, "messages": messages})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[3, 48, 118])
    parser.add_argument("--steps", type=int, default=1200, help="steps measured per figure")
    parser.add_argument("--reply-chars", type=int, default=1000)
    args = parser.parse_args()
    print(
        f"a step's state stored, {CONVERSATIONS} conversations updated in turn, "
        f"{args.steps} steps a figure, replies of {args.reply_chars} characters "
        "(Postgres backend CPU and write-ahead log per step)"
    )
    floor = None
    with database() as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        for turns in args.turns:
            messages = _messages(turns, args.reply_chars)
            whole = _state(messages, None)
            # Apart: the state holds the last turn's two messages; the step adds a turn
            # record with them (the inside of a JSON array), as a step does since migration 0011;
            # whole, the record is added without them, as before.
            last = messages[-2:]
            apart = _state(last, len(messages) - 2)
            record = json.dumps({"turn": turns, "output": last[-1]["content"]})
            added = json.dumps(last)[1:-1]

            store_whole = partial(_step, conn, state=whole, record=record, messages=None)
            store_apart = partial(_step, conn, state=apart, record=record, messages=added)
            whole_ms, whole_kb = _measure(conn, args.steps, store_whole)
            apart_ms, apart_kb = _measure(conn, args.steps, store_apart)
            floor = floor if floor is not None else whole_ms
            print(
                f"  turn {turns:>4} (state whole {len(whole) / 1024:6.1f} KB, apart "
                f"{len(apart) / 1024:4.1f} KB): whole {whole_ms:.3f} ms, {whole_kb:5.1f} KB "
                f"({whole_ms / floor:.2f}x the floor); apart {apart_ms:.3f} ms, "
                f"{apart_kb:5.1f} KB ({apart_ms / floor:.2f}x)"
            )


if __name__ == "__main__":
    main()
