"""kombu's Redis transport with these changes: a channel keeps its Redis client; a
channel closed with its connection leaves its unacknowledged messages to the restore
sweep instead of stopping the worker (`QoS`); a consumer's bookkeeping of the
messages it holds costs one Redis round trip per message instead of two, one script
recording the message taken and removing those acknowledged since, without encoding
each message again (`QoS.append`, `QoS.ack`), and the same script takes along the
messages waiting behind the one BRPOP gave, as many as the prefetch count allows
(`Channel._brpop_read`), a busy consumer holding its BRPOP a few milliseconds for more
of its slots to be free (`Channel._gathering`); the messages it holds share their
envelopes' keys and short values (`_shared_strings`).

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

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu import transport as kombu_transports
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads
from kombu.utils.json import object_hook as kombu_object_hook

logger = logging.getLogger(__name__)

# How long an acknowledgment may wait for the next message's bookkeeping to carry it
# to Redis before it is sent on its own (a worker with nothing left to take).
ACK_DELAY_SECONDS = 0.05

# The text of the message this thread parsed last, and what it parsed into: kombu
# stores each message it hands out in the unacked hash, and encoding it again there
# was ~4% of a busy worker's CPU; the text it was read from says the same.
_received = threading.local()


# What `QoS.append` does in one command: record a message taken (its delivery time in
# the unacked index, the message in the unacked hash, as kombu's own MULTI/EXEC writes
# them, so that kombu's restore reads them back unchanged), remove the messages
# acknowledged since (ARGV[5] on), and, when ARGV[4] is above 0, take up to that many
# more from the queue lists (KEYS[3] on, in BRPOP's order) and record each the same
# way, returning them as (list name, delivery tag, message) triples. redis-py's work
# for the transaction (six commands and six replies for a message and one
# acknowledgment) cost the consumer thread 40-70 us more per message than the script's
# (benchmarks/unacked_bookkeeping.py); a message taken with another costs no round trip
# of its own, nor a BRPOP. A message
# popped is recorded in the same script, so no crash can lose it in between. One whose
# envelope is not kombu's (no delivery tag) is returned unrecorded (tag ''), for the
# channel to handle as it would a message BRPOP gave it.
_RECORD = """
local now = ARGV[1]
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
for i = 5, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
local wanted = tonumber(ARGV[4])
local taken = {}
for k = 3, #KEYS do
  while wanted > 0 do
    local item = redis.call('RPOP', KEYS[k])
    if not item then break end
    wanted = wanted - 1
    local ok, message = pcall(cjson.decode, item)
    local properties = ok and type(message) == 'table' and message.properties
    local tag = type(properties) == 'table' and properties.delivery_tag
    if type(tag) == 'string' then
      local info = properties.delivery_info
      if type(info) ~= 'table' then info = {} end
      redis.call('ZADD', KEYS[1], now, tag)
      redis.call('HSET', KEYS[2], tag, '[' .. item .. ', ' .. cjson.encode(info.exchange)
        .. ', ' .. cjson.encode(info.routing_key) .. ']')
    else
      tag = ''
    end
    taken[#taken + 1] = KEYS[k]
    taken[#taken + 1] = tag
    taken[#taken + 1] = item
  end
end
return taken
"""

# At most this many messages taken along with one BRPOP's: each is handed to the pool
# in the same turn of the worker's event loop, which does nothing else meanwhile.
TAKE_AT_MOST = 32

# While messages wait behind those taken (the last script took all it asked for), the
# next BRPOP waits until an eighth of the worker's slots (prefetch count), at most
# GATHER_SLOTS, are free, or GATHER_SECONDS have passed since one was: a busy worker
# then takes several messages per round trip instead of one or two (~0.2 ms less CPU
# per turn at -c 100, benchmarks/RESULTS.md), for at most 10 ms more on a turn that
# waits for its agent far longer. A worker whose queue ran dry, or of 15 slots or
# fewer, sends its BRPOP at once.
GATHER_SLOTS = 16
GATHER_SECONDS = 0.01

# Longer values (the body, the arguments' display form) are each message's own.
_SHARED_VALUE_CHARS = 64


def _shared_strings(document: dict[str, Any]) -> Any:
    """`document` with its keys and text values interned, then as kombu decodes it.

    A worker holds every message it is running until the turn ends, thousands against
    a slow agent. Decoded as they come, each message's envelope (about 35 keys, the
    same in every message, and values such as the task's name, the content type and
    the queue, mostly the same too) was ~4 KB of strings of its own, a tenth of what a
    turn in flight holds (benchmarks/RESULTS.md); interned, they are one copy for all
    (an interned string no longer referenced is freed as any other)."""
    shared = {
        sys.intern(key): sys.intern(value)
        if type(value) is str and len(value) <= _SHARED_VALUE_CHARS
        else value
        for key, value in document.items()
    }
    return kombu_object_hook(shared)


def _decode(text: str) -> Any:
    return kombu_loads(text, object_hook=_shared_strings)  # type: ignore[no-untyped-call]


def _loads_keeping_text(text: str) -> Any:
    payload = _decode(text)
    _received.text = text
    _received.payload = payload
    return payload


def _stored_form(message: Any, exchange: str, routing_key: str) -> str:
    """What kombu stores in the unacked hash for a message: [payload, exchange, key]."""
    payload = message._raw
    if getattr(_received, "payload", None) is payload:
        # Parsed from this text and untouched since (nothing between reading a
        # message and recording it changes its payload).
        text: str = _received.text
        _received.payload = _received.text = None
        return f"[{text}, {json.dumps(exchange)}, {json.dumps(routing_key)}]"
    return str(kombu_dumps([payload, exchange, routing_key]))  # type: ignore[no-untyped-call]


def _drop_envelope(message: Any) -> None:
    """Let go of the envelope `message` was decoded from, once it is recorded.

    kombu's message keeps the decoded envelope (`_raw`) beside the headers, properties
    and body it took from it, for one use: the text recorded in the unacked hash. Once
    recorded, only its own dict and the body's base64 text are the envelope's alone,
    ~0.5 KB a message, held by every turn in flight until it ends. A message given back
    is restored from the unacked hash, and kombu's `serializable()` rebuilds an
    envelope from the parts it kept."""
    message._raw = None


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

    Acknowledgments made on the worker's event loop (where Celery acknowledges a task
    that finished on a pool thread) are not sent at once: the next message's `append`,
    which records it in the unacked hash, removes them from it in the same script
    (`_RECORD`), or a timer does after ACK_DELAY_SECONDS if no message comes. A busy
    worker thus pays one round trip per message instead of two. A worker killed in
    between leaves those messages in the unacked hash, like one killed just before
    acknowledging: they are given back after the visibility timeout and find their step
    already recorded.
    Closing the channel (a warm shutdown) sends them first.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._acks_lock = threading.Lock()
        self._acks_due: list[Any] = []
        self._acks_timer: Any = None
        self._record: Any = None
        # Set by the channel while it reads a BRPOP reply: the lists `append` may take
        # more messages from, with the one BRPOP gave (`Channel._brpop_read`).
        self.take_from: list[str] = []
        # What the script took along (list name, delivery tag, message text), and the
        # tags of those recorded, until the channel delivers them.
        self.taken: list[tuple[bytes, bytes, bytes]] = []
        self._recorded: set[str] = set()
        # Whether the last script took as many messages as it asked for (more may wait).
        self.backlog = False

    def _connection_gone(self) -> bool:
        connection = self.channel.connection
        return connection is None or connection.client is None

    def _event_loop(self) -> Any:
        """The hub this channel's transport is consumed from, when called on its thread."""
        hub = getattr(self.channel.connection, "hub", None)
        if hub is not None and getattr(hub, "_loop_thread", None) == threading.get_ident():
            return hub
        return None

    def _take_acks_due(self) -> list[Any]:
        with self._acks_lock:
            due, self._acks_due = self._acks_due, []
        return due

    def _give_back_acks(self, due: list[Any]) -> None:
        with self._acks_lock:
            self._acks_due[:0] = due

    def append(self, message: Any, delivery_tag: Any) -> None:
        if delivery_tag in self._recorded:
            # Taken and recorded by the script along with an earlier message.
            self._recorded.discard(delivery_tag)
            self._hold(message, delivery_tag)
            return
        delivery = message.delivery_info
        exchange, routing_key = delivery["exchange"], delivery["routing_key"]
        stored = _stored_form(message, exchange, routing_key)
        lists = self.take_from
        wanted = self._may_take_along() if lists else 0
        due = self._take_acks_due()
        try:
            with self.channel.conn_or_acquire() as client:
                taken = self._record_script(client)(
                    keys=[self.unacked_index_key, self.unacked_key, *(lists if wanted > 0 else ())],
                    args=[time.time(), delivery_tag, stored, wanted, *due],
                )
        except BaseException:
            self._give_back_acks(due)
            raise
        self._hold(message, delivery_tag)
        if wanted > 0:
            self.backlog = len(taken) == 3 * wanted
        if taken:
            self.taken.extend(zip(taken[::3], taken[1::3], taken[2::3], strict=True))

    def _hold(self, message: Any, delivery_tag: Any) -> None:
        """The message recorded: kept in this process's bookkeeping, without the
        envelope it was decoded from."""
        kombu_virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]
        _drop_envelope(message)

    def _may_take_along(self) -> int:
        """How many messages may come along with the one being recorded: what the
        prefetch count leaves besides it (it is not in `_delivered` yet), at most
        TAKE_AT_MOST."""
        room = self.can_consume_max_estimate()  # type: ignore[no-untyped-call]
        if room is None:  # no prefetch limit
            return TAKE_AT_MOST
        return max(min(int(room) - 1, TAKE_AT_MOST), 0)

    def mark_recorded(self, delivery_tag: str) -> None:
        """The message of `delivery_tag` is in the unacked hash already: `append` only
        notes it here."""
        self._recorded.add(delivery_tag)

    def _record_script(self, client: Any) -> Any:
        """`_RECORD` as a redis-py script of `client` (loaded again by redis-py if the
        server lost it, as a restarted Redis has)."""
        script = self._record
        if script is None or script.registered_client is not client:
            script = self._record = client.register_script(_RECORD)
        return script

    def _flush_acks(self) -> None:
        """Send the acknowledgments still due (the timer's, and a closing channel's)."""
        self._acks_timer = None
        due = self._take_acks_due()
        if not due or self._connection_gone():
            return
        try:
            with self.pipe_or_acquire() as pipe:
                for tag in due:
                    self._remove_from_indices(tag, pipe)  # type: ignore[no-untyped-call]
                pipe.execute()
        except Exception as exc:
            # Left in the unacked hash: given back after the visibility timeout, they
            # find their steps recorded. Raising here would stop the event loop.
            logger.warning("could not acknowledge %d message(s): %s", len(due), exc)

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        if self._acks_timer is not None:
            self._acks_timer.cancel()
        self._flush_acks()
        return super().restore_unacked_once(stderr)  # type: ignore[no-untyped-call]

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
        hub = self._event_loop()
        if hub is None:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
            return
        self.defer_ack(delivery_tag)
        if self._acks_timer is None:
            self._acks_timer = hub.call_later(ACK_DELAY_SECONDS, self._flush_acks)

    def defer_ack(self, delivery_tag: Any) -> None:
        """Acknowledge the message here now, in Redis with the next `append` (or
        `_flush_acks`): what `ack` does on the event loop, but for its timer."""
        with self._acks_lock:
            self._acks_due.append(delivery_tag)
        self._forget(delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._connection_gone():
            self._forget(delivery_tag)
            return
        super().reject(delivery_tag, requeue)  # type: ignore[no-untyped-call]


# The channel's QoS, as its methods' annotations name it (`QoS` there is the attribute).
_ChannelQoS = QoS


class Channel(kombu_redis.Channel):
    QoS = QoS
    _shared_client: Any = None
    qos: _ChannelQoS

    # While a BRPOP is held (GATHER_SLOTS): the timer that ends the wait, and whether it
    # has. The timer ends it, not a clock read at the next tick: a timer firing a hair
    # early, its tick finding the wait not quite over, left the BRPOP unsent until some
    # other event woke the loop (seconds later).
    _gather_timer: Any = None
    _gather_over = False

    def _brpop_start(self, timeout: Any = None) -> None:
        if self._gathering():
            return  # sent by `_gathered`, or at a tick once enough slots are free
        super()._brpop_start(timeout)  # type: ignore[no-untyped-call]

    def _gathering(self) -> bool:
        """Whether this BRPOP waits for more of the worker's slots to be free."""
        hub = getattr(self.connection, "hub", None)
        room = self.qos.can_consume_max_estimate()  # type: ignore[no-untyped-call]
        wanted = min(GATHER_SLOTS, (self.qos.prefetch_count or 0) // 8)
        if (
            hub is None
            or self._gather_over
            or not self.qos.backlog
            or room is None
            or room >= wanted
        ):
            self._stop_gathering()
            return False
        if self._gather_timer is None:
            self._gather_timer = hub.call_later(GATHER_SECONDS, self._gathered)
        return True

    def _stop_gathering(self) -> None:
        timer, self._gather_timer = self._gather_timer, None
        self._gather_over = False
        if timer is not None:
            timer.cancel()

    def _gathered(self) -> None:
        """The timer: the BRPOP waits no longer, and is sent now (as a tick would)."""
        self._gather_over = True
        cycle = getattr(self.connection, "cycle", None)
        try:
            if cycle is not None and not self._in_poll and self.qos.can_consume():  # type: ignore[no-untyped-call]
                cycle._register_BRPOP(self)
        except Exception as exc:
            # The next tick tries again; raising here would stop the event loop.
            logger.warning("could not ask for the next messages: %s", exc)

    def _brpop_read(self, **options: Any) -> Any:
        """kombu's, but the message BRPOP gave is recorded together with up to what the
        prefetch count leaves of the messages waiting behind it (`_RECORD`), which are
        then delivered in turn: a busy worker takes several messages per round trip
        instead of two round trips per message."""
        queue_of = {
            self._q_for_pri(queue, step): queue  # type: ignore[no-untyped-call]
            for step in self.priority_steps
            for queue in self._queue_cycle.consume(len(self.active_queues))
        }
        self.qos.take_from = list(queue_of)
        try:
            return super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        finally:
            self.qos.take_from = []
            if self.qos.taken:
                self._deliver_taken(queue_of)

    def _deliver_taken(self, queue_of: dict[str, str]) -> None:
        taken, self.qos.taken = self.qos.taken, []
        for index, (key, tag, item) in enumerate(taken):
            try:
                queue = queue_of[key.decode()]
                if tag:
                    self.qos.mark_recorded(tag.decode())
                self._queue_cycle.rotate(queue)
                self.connection._deliver(_decode(item.decode()), queue)
            except BaseException:
                self._give_back(taken[index + 1 :])
                raise

    def _give_back(self, taken: list[tuple[bytes, bytes, bytes]]) -> None:
        """Put messages taken but not delivered back where they were, first in line."""
        if not taken:
            return
        try:
            with self.conn_or_acquire() as client, client.pipeline() as pipe:
                for key, tag, item in reversed(taken):
                    pipe.rpush(key, item)
                    if tag:
                        self.qos._remove_from_indices(tag, pipe)  # type: ignore[no-untyped-call]
                pipe.execute()
        except Exception as exc:
            # Those recorded stay in the unacked hash: the restore sweep gives them
            # back after the visibility timeout.
            logger.warning("could not give back %d message(s): %s", len(taken), exc)

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
    hub: Any = None

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)  # type: ignore[no-untyped-call]
        self.hub = loop


SCHEMES = ("redis", "rediss")


def use_shared_clients() -> None:
    """Make `redis://` and `rediss://` brokers use this transport in this process
    (connections made from now on; kombu caches the class behind an alias, so a cached
    one is dropped)."""
    for scheme in SCHEMES:
        kombu_transports.TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
        kombu_transports._transport_cache.pop(scheme, None)
    # kombu's Redis channel parses every message it reads with this name.
    setattr(kombu_redis, "loads", _loads_keeping_text)  # noqa: B010 - not exported
