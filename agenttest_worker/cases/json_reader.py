"""JSONL and JSON case files (yao format): raw cases with their lines, within bounds.

A .jsonl file is read one line at a time, so that a 100,000-case file is never held
in memory at once; each case is located at its line. A .json file is one case object,
an array of cases or {"cases": [...]}; so is a .jsonl file written as the spec prints
cases (one pretty-printed object after another). Cases read from a whole document
know each field's line, found by walking the JSON text.

Hostile input is bounded: a case line over MAX_CASE_BYTES is skipped unread and JSON
nested deeper than MAX_DEPTH is rejected, each with a message, never a hang or a
traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agenttest_worker.cases.validation import Located, Path_, read_text
from agenttest_worker.errors import InputProblem

MAX_CASE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64

_DECODER = json.JSONDecoder()


def read_jsonl(path: Path) -> Iterator[Located | InputProblem]:
    """A .jsonl file: one case per line, each located at its line."""
    if not _first_line_parses(path):
        # Not JSONL after all? Cases written as the spec prints them (one pretty-printed
        # object after another, or an array) are read as such; else every bad line is
        # reported as usual.
        text = read_text(path)
        values = None if isinstance(text, InputProblem) else _json_values(text, str(path))
        if values is not None:
            yield from values
            return
    yield from _iter_json_lines(path)


def _first_line_parses(path: Path) -> bool:
    """Whether the first non-blank line is JSON (True when the file cannot be read: the
    line reader reports that)."""
    try:
        handle = path.open("rb")
    except OSError:
        return True
    with handle:
        for raw in _bounded_lines(handle):
            if isinstance(raw, InputProblem):
                return True
            text = raw.removeprefix(b"\xef\xbb\xbf").strip()
            if not text:
                continue
            try:
                json.loads(text)
            except (ValueError, RecursionError):
                return False
            return True
    return True


def _json_values(text: str, name: str) -> list[Located] | None:
    """The cases of a text holding one or more JSON documents one after another (each a
    case, an array of cases or {"cases": [...]}), with their lines; None if it does not."""
    found: list[Located] = []
    pos = _skip_ws(text, 0)
    try:
        while pos < len(text):
            value, end = _DECODER.raw_decode(text, pos)
            if _depth(value) > MAX_DEPTH:
                return None
            found += _document_cases(text, pos, value, name)
            pos = _skip_ws(text, end)
    except (json.JSONDecodeError, RecursionError):
        return None
    return found


def _iter_json_lines(path: Path) -> Iterator[Located | InputProblem]:
    name = str(path)
    try:
        handle = path.open("rb")
    except OSError as exc:
        yield InputProblem(f"cannot read: {exc.strerror}", file=name)
        return
    with handle:
        yield from read_jsonl_stream(handle, name)


def read_jsonl_stream(handle: Any, name: str) -> Iterator[Located | InputProblem]:
    """JSONL from an open binary stream (`-i -`: standard input), one case per line,
    each located at its line of `name`."""
    for number, raw in enumerate(_bounded_lines(handle), start=1):
        if isinstance(raw, InputProblem):
            yield InputProblem(raw.message, file=name, line=number)
            continue
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte order mark, as some editors write
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield InputProblem(
                f"not valid UTF-8 (byte {exc.start + 1}): save the file as UTF-8",
                file=name,
                line=number,
            )
            continue
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            yield InputProblem(
                f"invalid JSON: {exc.msg} (column {exc.colno})", file=name, line=number
            )
            continue
        except RecursionError:
            yield InputProblem(
                f"JSON nested deeper than {MAX_DEPTH} levels", file=name, line=number
            )
            continue
        if _may_be_deep(raw) and _depth(data) > MAX_DEPTH:
            yield InputProblem(
                f"JSON nested deeper than {MAX_DEPTH} levels", file=name, line=number
            )
            continue
        yield Located(data, name, number)


def _bounded_lines(handle: Any) -> Iterator[bytes | InputProblem]:
    """Lines of a binary file; a line over MAX_CASE_BYTES becomes a problem, unread."""
    while line := handle.readline(MAX_CASE_BYTES + 1):
        if len(line) > MAX_CASE_BYTES and not line.endswith(b"\n"):
            size = len(line)
            while chunk := handle.readline(1 << 20):  # skip the rest of the line
                size += len(chunk)
                if chunk.endswith(b"\n"):
                    break
            yield InputProblem(
                f"line is {size / 1e6:.1f} MB; a case may be at most {MAX_CASE_BYTES >> 20} MB"
            )
            continue
        yield line.rstrip(b"\r\n")


def read_json(path: Path) -> Iterator[Located | InputProblem]:
    """A .json file: one case object, an array of cases, or {"cases": [...]}.

    A file that is not one JSON document but parses line by line is read as JSONL.
    """
    name = str(path)
    text = read_text(path)
    if isinstance(text, InputProblem):
        yield text
        return
    start = _skip_ws(text, 0)
    if start == len(text):
        return  # no case at all: files.py says so for every format alike
    try:
        whole, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        yield InputProblem(
            f"invalid JSON: {exc.msg} (column {exc.colno})", file=name, line=exc.lineno
        )
        return
    except RecursionError:
        yield InputProblem(f"JSON nested deeper than {MAX_DEPTH} levels", file=name, line=1)
        return
    if _skip_ws(text, end) < len(text):
        # More than one document: several cases one after another, or JSONL.
        values = _json_values(text, name)
        yield from values if values is not None else _iter_json_lines(path)
        return
    if _depth(whole) > MAX_DEPTH:
        yield InputProblem(f"JSON nested deeper than {MAX_DEPTH} levels", file=name, line=1)
        return
    yield from _document_cases(text, start, whole, name)


def _document_cases(text: str, start: int, value: Any, name: str) -> Iterator[Located]:
    """The cases of the JSON document `value` at text[start]: one case object, an array
    of cases, or {"cases": [...]}."""
    if isinstance(value, dict) and isinstance(value.get("cases"), list):
        yield from _array_items(text, _member_start(text, start, "cases"), value["cases"], name)
    elif isinstance(value, list):
        yield from _array_items(text, start, value, name)
    else:
        yield _located(text, start, value, name)


def _array_items(text: str, start: int, items: list[Any], name: str) -> Iterator[Located]:
    """Each element of the array starting at text[start] == '[', with its line."""
    pos = _skip_ws(text, start + 1)
    for item in items:
        yield _located(text, pos, item, name)
        pos = _past_value(text, pos)


def _located(text: str, start: int, value: Any, name: str) -> Located:
    """A case read from a JSON document at text[start], its fields' lines findable."""
    return Located(
        value, name, _line_at(text, start), line_of=lambda path: _field_line(text, start, path)
    )


def _field_line(text: str, start: int, path: Path_) -> int:
    """The line of `path` in the JSON value at text[start] (or of the deepest part of it
    that is there: an unknown field's own key, a missing field's object)."""
    pos = start
    for part in path:
        pos = _skip_ws(text, pos)
        opening = text[pos] if pos < len(text) else ""
        if isinstance(part, str) and opening == "{":
            found = _member_start(text, pos, part)
        elif isinstance(part, int) and opening == "[":
            found = _element_start(text, pos, part)
        else:
            break
        if found < 0:
            break
        pos = found
    return _line_at(text, pos)


def _element_start(text: str, start: int, index: int) -> int:
    """Where element `index` of the array at text[start] == '[' starts, or -1."""
    pos = _skip_ws(text, start + 1)
    for _ in range(index):
        if pos >= len(text) or text[pos] == "]":
            return -1
        pos = _past_value(text, pos)
    return pos if pos < len(text) and text[pos] != "]" else -1


def _member_start(text: str, start: int, key: str) -> int:
    """Where the value of top-level `key` starts in the object at text[start] == '{'.

    Found by walking the object's members (not by searching for the key's text, which
    may also occur inside a nested object); the last occurrence wins, as in json.loads.
    """
    pos = _skip_ws(text, start + 1)
    found = -1
    while pos < len(text) and text[pos] != "}":
        member, pos = _DECODER.raw_decode(text, pos)
        pos = _skip_ws(text, _skip_ws(text, pos) + 1)  # past the ':'
        if member == key:
            found = pos
        pos = _past_value(text, pos)
    return found


def _past_value(text: str, pos: int) -> int:
    """Where the next element or member starts after the value at text[pos] (past the
    comma), or the closing bracket."""
    _, pos = _DECODER.raw_decode(text, pos)
    pos = _skip_ws(text, pos)
    if pos < len(text) and text[pos] == ",":
        pos = _skip_ws(text, pos + 1)
    return pos


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _may_be_deep(raw: bytes) -> bool:
    """Whether JSON text could nest deeper than MAX_DEPTH: a value that deep sits in at
    least MAX_DEPTH arrays or objects, each opened by a bracket of the text (brackets
    inside strings only add to the count). Counting them costs a small fraction of
    walking the parsed value, which a line of a million-case file would otherwise pay."""
    return raw.count(b"[") + raw.count(b"{") >= MAX_DEPTH


def _depth(value: Any, limit: int = MAX_DEPTH + 1) -> int:
    """Nesting depth of JSON data, counted without recursion and capped at `limit`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest >= limit:
                return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest
