"""A consumer's bookkeeping per message taken, against kombu's own, in one run.

    python -m benchmarks.unacked_bookkeeping --messages 3000 --rounds 5

A worker's consumer thread records every message it takes in Redis (kombu keeps it in
an unacked hash and index until it is acknowledged, so that a dead worker's messages
are given back) and removes it when the task ends. Both sides take the same messages
off a real Redis list with `basic_get` and acknowledge each:
- floor: kombu's own Redis transport, one MULTI/EXEC to record a message and one to
  acknowledge it (`Message.ack`);
- agenttest: its transport (agenttest_worker/fleet/transport.py), where the
  acknowledgment made on the worker's event loop rides on the next message's record,
  one script for both (`QoS.append`). Here the acknowledgment is handed over as the
  event loop's `ack` would, then carried by the next `basic_get`.
Prints, per message, this process's CPU (user + system: redis-py's commands and
replies, kombu's decoding) and Redis's, each round and their medians, the sides
alternating (this machine's speed drifts more than the difference).

Needs Redis at 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, NamedTuple

from benchmarks.throughput import REDIS, process_cpu_seconds, redis_db, servers_cpu_seconds

QUEUE = "bookkeeping-bench"


class Cost(NamedTuple):
    client_us: float  # this process's CPU per message
    redis_us: float  # Redis's


def _publish(app: Any, count: int) -> None:
    with app.connection_for_write() as connection, connection.Producer() as producer:
        for n in range(count):
            # A turn task's envelope is ~1 KB: a body and headers of about that size.
            producer.publish(
                {"args": ["20261207-000000-abcdef", f"c{n}", 2]},
                routing_key=QUEUE,
                declare=[],
                headers={"task": "agenttest.turn", "argsrepr": "x" * 600},
            )


def _take_all(channel: Any, count: int, carried: bool) -> None:
    """Take `count` messages, acknowledging each: at once (kombu's way), or handed to
    the QoS as the worker's event loop does and carried by the next message's record."""
    last = None
    for _ in range(count):
        message = channel.basic_get(QUEUE, no_ack=False)
        if carried:
            if last is not None:
                channel.qos.defer_ack(last.delivery_tag)  # QoS.ack on the loop, but its timer
            last = message
        else:
            message.ack()
    if carried and last is not None:
        channel.qos.defer_ack(last.delivery_tag)
        channel.qos._flush_acks()


def measure(broker: str, count: int, ours: bool) -> Cost:
    from celery import Celery
    from kombu import transport as kombu_transports

    from agenttest_worker.fleet.transport import SCHEMES, use_shared_clients

    if ours:
        use_shared_clients()
    else:
        for scheme in SCHEMES:
            kombu_transports.TRANSPORT_ALIASES[scheme] = "kombu.transport.redis:Transport"
            kombu_transports._transport_cache.pop(scheme, None)
    app = Celery(broker=broker)
    _publish(app, count)
    connection = app.connection_for_write()
    channel = connection.default_channel
    channel.basic_get(QUEUE, no_ack=True)  # connected, and one message fewer to time
    pid = os.getpid()
    client_before = process_cpu_seconds(pid)
    redis_before = servers_cpu_seconds()[1]
    _take_all(channel, count - 1, carried=ours)
    client = process_cpu_seconds(pid) - client_before
    redis_cpu = servers_cpu_seconds()[1] - redis_before
    connection.release()
    return Cost(client / (count - 1) * 1e6, redis_cpu / (count - 1) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    floors: list[Cost] = []
    ours: list[Cost] = []
    with redis_db() as broker:
        for number in range(args.rounds):
            floors.append(measure(broker, args.messages, ours=False))
            ours.append(measure(broker, args.messages, ours=True))
            floor, own = floors[-1], ours[-1]
            print(
                f"round {number + 1}: kombu {floor.client_us:.0f} us (Redis {floor.redis_us:.0f}), "
                f"agenttest {own.client_us:.0f} us (Redis {own.redis_us:.0f}) per message: "
                f"{own.client_us / floor.client_us:.2f}"
            )
            time.sleep(0.1)
    ratios = [o.client_us / f.client_us for f, o in zip(floors, ours, strict=True)]
    print(
        f"a message taken and acknowledged, {args.messages} per round, {REDIS}: consumer CPU "
        f"kombu median {statistics.median(f.client_us for f in floors):.0f} us, agenttest "
        f"{statistics.median(o.client_us for o in ours):.0f} us (ratio median "
        f"{statistics.median(ratios):.2f}); Redis CPU kombu "
        f"{statistics.median(f.redis_us for f in floors):.0f} us, agenttest "
        f"{statistics.median(o.redis_us for o in ours):.0f} us"
    )


if __name__ == "__main__":
    main()
