"""JSON helpers shared by the agents, the assertions and the engine.

They sit below all three so that none has to import another for them: reading a JSON
reply, comparing values as JSON does, evaluating JSONPaths (response mappings of
`http` agents, `json_path` assertions), and writing what grows with a conversation
(`compact_json`; a request's body, `body_bytes`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import orjson


def compact_json(value: Any) -> bytes | None:
    """`value` as compact JSON in UTF-8, written by orjson (~18x json.dumps's speed on a
    conversation's messages); None where orjson refuses it (an integer past 64 bits, a
    lone surrogate), for the caller to write it as before."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return None


def body_bytes(value: Any) -> bytes:
    """`value` as a request's JSON body, UTF-8.

    A chat agent is sent the whole conversation every turn, so writing the body was
    the most a turn's cost grew with its conversation's length, and orjson writes it
    many times faster than json.dumps (benchmarks/long_conversation.py). What orjson refuses is
    written, or refused, by json.dumps as before."""
    written = compact_json(value)
    return json.dumps(value, ensure_ascii=False).encode() if written is None else written


# How deep an agent's reply may nest its JSON (objects and arrays in one another). What
# a reply holds goes into the conversation's state and records, a few levels further
# down; pydantic refuses to write a value nested past 255 levels and its parser to read
# one past 200, so a deeper reply would make its step unsavable, or its records
# unreadable by every report. A reply nested deeper fails its turn (docs/DESIGN.md).
MAX_REPLY_DEPTH = 64


def nested_deeper_than(value: Any, limit: int = MAX_REPLY_DEPTH, text: str | None = None) -> bool:
    """Whether `value` nests objects and arrays more than `limit` levels deep (a scalar
    is level 0, `{}` and `[1]` level 1). Only containers are visited, and the walk stops
    at the first one past the limit. `text`, the JSON `value` was parsed from, spares
    the walk when it opens no more than `limit` objects and arrays in all (most replies):
    counting its brackets costs a fraction of walking what they open."""
    if text is not None and text.count("{") + text.count("[") <= limit:
        return False
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner: list[Any] = []
        for container in level:
            items = container.values() if isinstance(container, dict) else container
            inner.extend(item for item in items if isinstance(item, dict | list))
        level = inner
    return False


def too_deep_message(what: str, limit: int = MAX_REPLY_DEPTH) -> str:
    """The reason a turn fails when `what` (its agent's reply, a tool call's arguments,
    the state it reported) nests past `limit` levels."""
    return f"{what} nested deeper than {limit} levels"


def parse_json(text: str | None) -> tuple[bool, Any]:
    """(True, value) when `text` is a JSON object or array, else (False, None).

    Bare scalars are not treated as JSON: a reply "42" or "true" is text that happens
    to parse, and reading it as a number would surprise `contains` users.
    """
    if not text:
        return False, None
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return False, None
    try:
        return True, json.loads(stripped)
    except (ValueError, RecursionError):  # (nested past the parser's own limit)
        return False, None


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: true is not 1, 1 equals 1.0, containers compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


@lru_cache(maxsize=4096)
def compile_path(path: str) -> Any:
    # Imported on first use: runs without JSONPaths do not pay for building its parser.
    from jsonpath_ng.ext.parser import parse as parse_jsonpath

    try:
        return parse_jsonpath(path)
    except Exception as exc:  # jsonpath-ng raises several unrelated exception types
        raise ValueError(f"invalid JSONPath {path!r}: {exc}") from None


def find(path: str, document: Any) -> list[Any]:
    return [match.value for match in compile_path(path).find(document)]
