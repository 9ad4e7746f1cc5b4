"""kombu's Redis transport, surviving what it cannot read: a queue item or an entry of its
unacknowledged hash that is not a kombu message is logged (a short escaped prefix) and
moved aside to a list, `<queue>.malformed` or `unacked.malformed`, whole, for an operator.

Report upstream (kombu 5.7, redis.py): `Channel._brpop_read` and `QoS.restore_by_tag` /
`Channel._restore` decode what Redis holds without catching anything, so one item that
is not JSON, not a message (`[]`, no `properties`, a body that is not base64) or, in the
hash, not `[message, exchange, routing_key]` raises out of the consumer's event loop:
the worker dies, and dies again at every start while the hash holds the entry.

The fix reads every BRPOP reply and every HGET reply (kombu HGETs only that hash) through
the public `parse_response` of the client class kombu's Channel uses (its public `Client`)
and of that client's pipelines; an item it refuses reads as nothing, which kombu already
handles: BRPOP as an empty poll, HGET as an entry to drop.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

logger = logging.getLogger(__name__)

# Between a queue's name and its priority step in kombu's list names (`agenttest:9`).
PRIORITY_SEP = ":"
MALFORMED_SUFFIX = ".malformed"
UNACKED_ASIDE = kombu_redis.Channel.unacked_key + MALFORMED_SUFFIX
BODY_ENCODINGS = (None, "utf-8", "base64")
ROUTE = ("exchange", "routing_key")


def message_problem(payload: Any) -> str | None:
    """What keeps kombu and Celery from reading `payload` as a message, or None."""
    if not isinstance(payload, dict) or not isinstance(payload.get("properties"), dict):
        return "not a message with properties"
    properties, body = payload["properties"], payload.get("body")
    info = properties.get("delivery_info")
    if not isinstance(properties.get("delivery_tag"), str):
        return "no delivery tag"
    if not isinstance(info, dict) or not all(
        isinstance(info.get(k), str) for k in ("exchange", "routing_key")
    ):
        return "no exchange and routing key"
    if not isinstance(payload.get("headers", {}), dict | None):
        return "headers are not an object"
    if not isinstance(properties.get("priority", 0), int):
        return "priority is not an integer"
    if body is not None and not isinstance(body, str):
        return "body is not a string"
    if properties.get("body_encoding") not in BODY_ENCODINGS:
        return "unknown body encoding"
    if body and properties.get("body_encoding") == "base64":
        try:
            base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return "body is not base64"
    return None


def item_problem(raw: bytes, unacked: bool) -> str | None:
    """What is wrong with a queue item (or, `unacked`, an entry of the hash), or None."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8"
    except ValueError:
        return "not JSON"
    if not unacked:
        return message_problem(value)
    if not (
        isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value[1:])
    ):
        return "not [message, exchange, routing key]"
    return message_problem(value[0])


def set_aside(pool: redis.ConnectionPool, where: str, raw: bytes, problem: str) -> None:
    # On a connection of its own: the client's own may be the consumer's BRPOP one.
    redis.Redis(connection_pool=pool).rpush(where, raw)
    logger.error("malformed broker message moved to %s (%s): %r…", where, problem, raw[:40])


class CheckedPipeline(redis.client.Pipeline):
    def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        reply = super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]
        if command_name == "HGET" and isinstance(reply, bytes):
            problem = item_problem(reply, unacked=True)
            if problem:
                set_aside(self.connection_pool, UNACKED_ASIDE, reply, problem)
                return None
        return reply


class CheckedRedis(redis.Redis):
    def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        reply = super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]
        if command_name == "BRPOP" and reply:
            key, item = reply
            problem = item_problem(item, unacked=False)
            if problem:
                queue, _, step = key.decode().rpartition(PRIORITY_SEP)
                where = (queue if queue and step.isdigit() else key.decode()) + MALFORMED_SUFFIX
                set_aside(self.connection_pool, where, item, problem)
                return None
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> CheckedPipeline:
        return CheckedPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


class Channel(kombu_redis.Channel):
    @property
    def Client(self) -> type[redis.Redis]:
        return CheckedRedis

    @Client.setter
    def Client(self, stock: Any) -> None:
        # kombu sets its choice in __init__; a key prefix would need its prefixing client.
        if stock is not redis.Redis:
            raise ValueError("the agenttest Redis transport does not support global_keyprefix")


class Transport(kombu_redis.Transport):
    Channel = Channel
