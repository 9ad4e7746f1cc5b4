"""What every case reader shares: a raw case with where it was read, and its validation.

A reader (json_reader.py, yaml_reader.py) yields `Located` raw cases; `validate_case`
turns one into a `Case` or into one problem per error, each with file, line (the
field's own line when the reader can find it) and field, named as the author wrote
it. `problems_from_validation` words pydantic's errors for people.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agenttest_worker.assertions import assertion_types
from agenttest_worker.cases.case_model import Case, CaseSource, FieldError
from agenttest_worker.errors import InputProblem, format_field
from agenttest_worker.yamlfile import YamlPath

Path_ = YamlPath


# Not frozen: a frozen dataclass sets each field through object.__setattr__, several
# times slower, for every line of a million-case file. Nothing changes one once made.
@dataclass(slots=True)
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


def validate_case(item: Located) -> Iterator[Case | InputProblem]:
    """Validate one raw yao case; yields the Case or one problem per error."""
    data = item.data
    if not isinstance(data, dict):
        yield InputProblem(
            f"a case is a JSON object, got {json_kind(data)}", file=item.file, line=item.line
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


def read_text(path: Path) -> str | InputProblem:
    """A whole case file as text, or the problem reading it (located at the bad byte)."""
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


_KINDS: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}


def json_kind(value: Any) -> str:
    return _KINDS.get(type(value), repr(value))


# -- validation errors as user-facing problems --------------------------------------------


def problems_from_validation(
    exc: ValidationError,
    file: str,
    line_for: Callable[[Path_], int | None],
    test: str | None,
) -> Iterator[InputProblem]:
    types = assertion_types()
    for err in exc.errors(include_url=False):
        loc = _user_loc(tuple(err["loc"]), types)
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):  # a cross-field check names its own field
            loc = (*loc, cause.field)
        yield InputProblem(
            _user_message(err, types),
            file=file,
            line=line_for(loc),
            field=format_field(loc) or None,
            test=test,
        )


def _user_loc(loc: Path_, types: tuple[str, ...]) -> Path_:
    """Drop pydantic's union-tag segments: ('assertions', 0, 'contains', 'value') -> ...

    A tag follows a list index, or the one assertion a `not` holds (its `assertion`)."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        after = loc[i - 1] if i > 0 else None
        if (
            isinstance(part, str)
            and part in types
            and (isinstance(after, int) or after == "assertion")
        ):
            continue
        if isinstance(part, str) and part.startswith("function-"):
            continue
        out.append(part)
    return tuple(out)


def _user_message(err: Any, types: tuple[str, ...]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (a typo?)"
    if kind == "union_tag_invalid":
        got = err.get("ctx", {}).get("tag")
        return f"unknown assertion type {got!r} (known: {', '.join(types)})"
    if kind == "union_tag_not_found":
        return f"assertion has no `type` (known: {', '.join(types)})"
    message = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message
