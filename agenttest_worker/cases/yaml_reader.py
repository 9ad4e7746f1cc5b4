"""YAML case files (tdx format): a `tests:` list, each test read into a case.

A test is validated as a tdx test first (flat `user_input` + `criteria`, or
`rounds`), so that its problems name the fields the author wrote, then converted to
the case data every format becomes and validated as a case. The YAML is parsed by
yamlfile.py, which keeps every node's line and rejects documents whose aliases expand
past MAX_YAML_NODES (an alias bomb) with a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from agenttest_worker.cases.case_model import Case
from agenttest_worker.cases.validation import (
    Located,
    Path_,
    json_kind,
    problems_from_validation,
    read_text,
    validate_case,
)
from agenttest_worker.cases.yaml_model import YamlTest
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.yamlfile import parse_yaml


def read_yaml(path: Path) -> Iterator[Case | InputProblem]:
    name = str(path)
    text = read_text(path)
    if isinstance(text, InputProblem):
        yield text
        return
    try:
        data, lines = parse_yaml(text, name)
    except InputError as exc:
        yield from exc.problems
        return
    if data is None:
        return  # only comments, or nothing: files.py says the file holds no cases
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
            yield InputProblem(f"a test is a mapping, got {json_kind(raw)}", file=name, line=line)
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
