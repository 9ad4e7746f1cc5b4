"""Readers for case files: JSONL/JSON (yao format) and YAML (tdx format).

Every problem is reported with file, line (or test name) and field, and a reader goes
on past a bad case so that one run of the CLI lists all of them. JSONL is read one
line at a time so that a 100,000-case file is never held in memory at once.

Hostile input is bounded: a case line over MAX_CASE_BYTES, JSON nested deeper than
MAX_DEPTH and YAML whose aliases expand past MAX_YAML_NODES are rejected with a
message, never a hang or a traceback.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agenttest_worker.assertions import ASSERTION_TYPES
from agenttest_worker.cases.model import Case, CaseSource, FieldError, YamlTest
from agenttest_worker.errors import InputError, InputProblem, format_field
from agenttest_worker.yamlfile import YamlPath, parse_yaml

CASE_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
}
MAX_CASE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64
# A directory of cases may hold the project's own config; it is not a case file.
CONFIG_NAMES = {"agenttest.yaml", "agenttest.yml"}

Path_ = YamlPath


@dataclass(frozen=True)
class Located:
    """A raw case (a dict) with where it was read, before validation."""

    data: Any
    file: str
    line: int
    test: str | None = None
    # How it was written when that differs from the data (YAML); else read from the data.
    source: CaseSource | None = None
    # The line of a field, for a case spread over several lines (an indented JSON one).
    line_of: Callable[[Path_], int | None] | None = None


# -- entry points ----------------------------------------------------------------------


def is_case_file(path: Path) -> bool:
    return path.suffix.lower() in CASE_SUFFIXES


def case_files_in(path: Path) -> list[Path]:
    """The case files a path names: itself, or every case file under a directory."""
    if path.is_dir():
        found = [
            p
            for p in sorted(path.rglob("*"))
            if p.is_file()
            and is_case_file(p)
            and p.name not in CONFIG_NAMES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ]
        if not found:
            raise InputError(
                InputProblem(f"no case files (*.jsonl, *.json, *.yaml, *.yml) in {path}")
            )
        return found
    if not is_case_file(path):
        raise InputError(
            InputProblem(
                f"unknown case file type {path.suffix or '(none)'!r}: "
                "use .jsonl or .json (yao format) or .yaml/.yml (tdx format)",
                file=str(path),
            )
        )
    return [path]


def iter_cases(path: Path) -> Iterator[Case | InputProblem]:
    """Every case in one file, in order, or the problems found in its place."""
    kind = CASE_SUFFIXES[path.suffix.lower()]
    if kind == "yaml":
        yield from _iter_yaml_cases(path)
        return
    reader = _iter_jsonl if kind == "jsonl" else _iter_json
    for item in reader(path):
        if isinstance(item, InputProblem):
            yield item
        else:
            yield from validate_case(item)


def load_cases(path: Path) -> list[Case]:
    """All cases under `path`; every problem found raised together as an InputError."""
    cases: list[Case] = []
    problems: list[InputProblem] = []
    for file in case_files_in(path):
        for item in iter_cases(file):
            (problems if isinstance(item, InputProblem) else cases).append(item)  # type: ignore[arg-type]
    if problems:
        raise InputError(problems)
    return cases


def validate_case(item: Located) -> Iterator[Case | InputProblem]:
    """Validate one raw yao case; yields the Case or one problem per error."""
    data = item.data
    if not isinstance(data, dict):
        yield InputProblem(
            f"a case is a JSON object, got {_json_kind(data)}", file=item.file, line=item.line
        )
        return
    line_of = item.line_of
    try:
        case = Case.model_validate(data)
    except ValidationError as exc:
        raw_id = data.get("id")
        case_id = str(raw_id) if isinstance(raw_id, str | int) and raw_id != "" else None
        test = item.test or case_id

        def line_for(loc: Path_) -> int:
            return (line_of(loc) if line_of else None) or item.line

        for problem in problems_from_validation(exc, item.file, line_for, test):
            yield dataclasses.replace(problem, case_id=case_id)
        return
    case.source_file, case.source_line = item.file, item.line
    source = item.source
    if source is None:
        # One line of JSONL: the same two sources serve every case (100,000 of them).
        single = "input" in data
        if line_of is not None:
            source = CaseSource(single=single, line_of=line_of)
        else:
            source = _ONE_LINE_SINGLE if single else _ONE_LINE_TURNS
    case.written_as(source)
    yield case


_ONE_LINE_SINGLE, _ONE_LINE_TURNS = CaseSource(single=True), CaseSource()


# -- JSONL / JSON --------------------------------------------------------------------------

_DECODER = json.JSONDecoder()


def _iter_jsonl(path: Path) -> Iterator[Located | InputProblem]:
    if not _first_line_parses(path):
        # Not JSONL after all? Cases written as the spec prints them (one pretty-printed
        # object after another, or an array) are read as such; else every bad line is
        # reported as usual.
        text = _read_text(path)
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
            if _depth(data) > MAX_DEPTH:
                yield InputProblem(
                    f"JSON nested deeper than {MAX_DEPTH} levels", file=name, line=number
                )
                continue
            yield Located(data, name, number)


def _bounded_lines(handle: Any) -> Iterator[bytes | InputProblem]:
    """Lines of a binary file; a line over MAX_CASE_BYTES becomes a problem, unread."""
    while True:
        line = handle.readline(MAX_CASE_BYTES + 1)
        if not line:
            return
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


def _iter_json(path: Path) -> Iterator[Located | InputProblem]:
    """A .json file: one case object, an array of cases, or {"cases": [...]}.

    A file that is not one JSON document but parses line by line is read as JSONL.
    """
    name = str(path)
    text = _read_text(path)
    if isinstance(text, InputProblem):
        yield text
        return
    start = _skip_ws(text, 0)
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


def _read_text(path: Path) -> str | InputProblem:
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return InputProblem(f"cannot read: {exc.strerror}", file=name)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        return InputProblem("not valid UTF-8: save the file as UTF-8", file=name, line=line)


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


_KINDS: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}


def _json_kind(value: Any) -> str:
    return _KINDS.get(type(value), repr(value))


# -- YAML ----------------------------------------------------------------------------------


def _iter_yaml_cases(path: Path) -> Iterator[Case | InputProblem]:
    name = str(path)
    text = _read_text(path)
    if isinstance(text, InputProblem):
        yield text
        return
    try:
        data, lines = parse_yaml(text, name)
    except InputError as exc:
        yield from exc.problems
        return
    if not isinstance(data, dict) or "tests" not in data:
        yield InputProblem(
            "a YAML case file is a mapping with a `tests:` list (tdx format)", file=name, line=1
        )
        return
    unknown = sorted(str(k) for k in data if k not in ("tests", "agent"))
    for key in unknown:
        yield InputProblem(
            "unknown top-level key", file=name, line=lines.line_of((key,)), field=key
        )
    tests = data["tests"]
    if not isinstance(tests, list):
        yield InputProblem("`tests` must be a list", file=name, line=lines.line_of(("tests",)))
        return
    file_agent = data.get("agent")
    for index, raw in enumerate(tests):
        base: Path_ = ("tests", index)
        line = lines.line_of(base) or 1
        test_name = raw.get("name") if isinstance(raw, dict) else None
        label = str(test_name) if isinstance(test_name, str | int) else None
        if not isinstance(raw, dict):
            yield InputProblem(f"a test is a mapping, got {_json_kind(raw)}", file=name, line=line)
            continue
        if file_agent is not None and "agent" not in raw:
            raw = {**raw, "agent": file_agent}

        def line_for(loc: Path_, base: Path_ = base, fallback: int = line) -> int:
            return lines.line_of((*base, *loc)) or fallback

        try:
            test = YamlTest.model_validate(raw)
        except ValidationError as exc:
            yield from problems_from_validation(exc, name, line_for, label)
            continue
        source = test.source(base, lines.line_of)
        yield from validate_case(Located(test.to_case_data(), name, line, label, source))


# -- validation errors as user-facing problems --------------------------------------------


def problems_from_validation(
    exc: ValidationError,
    file: str,
    line_for: Callable[[Path_], int | None],
    test: str | None,
) -> Iterator[InputProblem]:
    for err in exc.errors(include_url=False):
        loc = _user_loc(tuple(err["loc"]))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):  # a cross-field check names its own field
            loc = (*loc, cause.field)
        yield InputProblem(
            _user_message(err),
            file=file,
            line=line_for(loc),
            field=format_field(loc) or None,
            test=test,
        )


def _user_loc(loc: Path_) -> Path_:
    """Drop pydantic's union-tag segments: ('assertions', 0, 'contains', 'value') -> ..."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if (
            isinstance(part, str)
            and part in ASSERTION_TYPES
            and i > 0
            and isinstance(loc[i - 1], int)
        ):
            continue
        if isinstance(part, str) and part.startswith("function-"):
            continue
        out.append(part)
    return tuple(out)


def _user_message(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (a typo?)"
    if kind == "union_tag_invalid":
        got = err.get("ctx", {}).get("tag")
        return f"unknown assertion type {got!r} (known: {', '.join(ASSERTION_TYPES)})"
    if kind == "union_tag_not_found":
        return f"assertion has no `type` (known: {', '.join(ASSERTION_TYPES)})"
    message = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message
