"""Case files: finding them, and reading each by its suffix into cases.

Readers, one per format: json_reader.py (JSONL/JSON, yao format) and yaml_reader.py
(YAML, tdx format); validation.py turns what they read into cases. Every problem is
reported with file, line (or test name) and field, and a reader goes on past a bad
case so that one run of the CLI lists all of them.

Hostile input is bounded: a case line over MAX_CASE_BYTES, JSON nested deeper than
MAX_DEPTH (both in json_reader.py) and YAML whose aliases expand past MAX_YAML_NODES
(yamlfile.py) are rejected with a message, never a hang or a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from agenttest_worker.cases.case_model import Case
from agenttest_worker.cases.json_reader import read_json, read_jsonl, read_jsonl_stream
from agenttest_worker.cases.validation import Located, validate_case
from agenttest_worker.errors import InputError, InputProblem

CASE_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
}
# A directory of cases may hold the project's own config; it is not a case file.
CONFIG_NAMES = {"agenttest.yaml", "agenttest.yml"}

__all__ = [
    "CASE_SUFFIXES",
    "CONFIG_NAMES",
    "Located",
    "case_files_in",
    "is_case_file",
    "iter_cases",
    "iter_stream_cases",
    "load_cases",
    "validate_case",
]


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
    """Every case in one file, in order, or the problems found in its place.

    A file with no case at all is a problem of its own, wherever it was named (alone,
    next to other inputs, in a folder): a truncated or never-filled file must not make
    a run that passes with fewer tests than meant.
    """
    found = False
    for item in _read_cases(path):
        found = True
        yield item
    if not found:
        empty = " (it is empty)" if _is_blank(path) else ""
        yield InputProblem(f"no test cases in this file{empty}", file=str(path))


def iter_stream_cases(handle: BinaryIO, name: str) -> Iterator[Case | InputProblem]:
    """Every case of JSONL read from an open stream (`-i -`: standard input), located
    at its line of `name`; no case at all is a problem, as for a file."""
    found = False
    for item in read_jsonl_stream(handle, name):
        found = True
        if isinstance(item, InputProblem):
            yield item
        else:
            yield from validate_case(item)
    if not found:
        yield InputProblem("no test cases in this input (it is empty)", file=name)


def _read_cases(path: Path) -> Iterator[Case | InputProblem]:
    kind = CASE_SUFFIXES[path.suffix.lower()]
    if kind == "yaml":
        # Imported here: a run of JSONL files never needs the tdx models.
        from agenttest_worker.cases.yaml_reader import read_yaml

        yield from read_yaml(path)
        return
    reader = read_jsonl if kind == "jsonl" else read_json
    for item in reader(path):
        if isinstance(item, InputProblem):
            yield item
        else:
            yield from validate_case(item)


def _is_blank(path: Path) -> bool:
    """Whether the file holds nothing but white space (and, in YAML, comments)."""
    comment = b"#" if CASE_SUFFIXES[path.suffix.lower()] == "yaml" else None
    try:
        with path.open("rb") as handle:
            for line in handle:
                text = line.strip().removeprefix(b"\xef\xbb\xbf").strip()
                if text and not (comment and text.startswith(comment)):
                    return False
    except OSError:
        return False
    return True


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
