"""kombu's Redis transport with two changes: a channel keeps its Redis client, and a
channel closed with its connection leaves its unacknowledged messages to the restore
sweep instead of stopping the worker (`QoS`).

kombu's Redis channel builds a new `redis.Redis` client for every publish, fanout
(task event) and acknowledgment outside the consumer's poll (`conn_or_acquire`). The
client is only a handle on the channel's connection pool, but redis-py 5+ rebuilds
its response-callback tables per instance: in a worker at 70 turns/s that object
churn was about 9% of the process's CPU. Here each channel builds one client per
connection pool and reuses it. A redis-py client is safe to share between threads
(every command takes a connection from the pool), and a new pool (kombu makes one
after the connection is reset) gets a new client, so nothing about reconnecting
changes.

Used for `redis://` and `rediss://` (TLS) brokers (celery_app.py calls
`use_shared_clients`); TLS is set up by kombu's channel from the connection's `ssl`
options, which this module does not touch. It is installed under kombu's own "redis"
and "rediss" aliases rather than named as Celery's `broker_transport`, so that
connection URLs keep their scheme: Flower reads the broker's kind from it (its
queue-length page).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu import transport as kombu_transports
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual


class QoS(kombu_redis.QoS):
    """Acknowledgments on a channel whose connection is gone leave Redis alone.

    After a broker outage Celery closes the consumer's connection, then its channel;
    a turn still running meanwhile finishes later and acknowledges its message on that
    channel. kombu then tried to reach Redis through connection details already
    dropped and raised AttributeError in the worker's event loop, which stopped the
    worker ("Unrecoverable error"): from giving back the channel's unacknowledged
    messages as it closed, and from a late ack or reject. Instead, those messages stay
    in Redis's unacked hash, and any worker's restore sweep gives them back after the
    visibility timeout, as for a worker that died (a turn that already ran finds itself
    recorded: a step is idempotent).
    """

    def _connection_gone(self) -> bool:
        connection = self.channel.connection
        return connection is None or connection.client is None

    def restore_unacked(self, client: Any = None) -> None:
        if client is None and self._connection_gone():
            self._delivered.clear()
            return
        super().restore_unacked(client)  # type: ignore[no-untyped-call]

    def _forget(self, delivery_tag: Any) -> None:
        """Drop the message from this process's bookkeeping only (not from Redis)."""
        kombu_virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: Any) -> None:
        if self._connection_gone():
            self._forget(delivery_tag)
            return
        super().ack(delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._connection_gone():
            self._forget(delivery_tag)
            return
        super().reject(delivery_tag, requeue)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()  # type: ignore[no-untyped-call]
        yield shared


class Transport(kombu_redis.Transport):
    Channel = Channel


SCHEMES = ("redis", "rediss")


def use_shared_clients() -> None:
    """Make `redis://` and `rediss://` brokers use this transport in this process
    (connections made from now on; kombu caches the class behind an alias, so a cached
    one is dropped)."""
    for scheme in SCHEMES:
        kombu_transports.TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
        kombu_transports._transport_cache.pop(scheme, None)
