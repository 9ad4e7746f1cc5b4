"""The `-i` argument, parsed exactly as the spec's "Input Sources" section.

./tests.jsonl | ./tests/           a case file (by extension) or a folder of them
"Hello, how are you?"              a direct message (not an existing path; needs -n)
agents:ID?count=10&focus=x         cases from a generator agent
scripts:ID?scenario=y              cases from a generator script

`parse_inputs` classifies every -i value of a run, with the problems of all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from agenttest_worker.agents import Ref, parse_ref
from agenttest_worker.cases import CASE_SUFFIXES
from agenttest_worker.errors import InputError, InputProblem


@dataclass(frozen=True)
class FileInput:
    path: Path

    def describe(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class MessageInput:
    text: str
    # The n-th message given with -i: each becomes its own case (message, message-2, ...).
    number: int = 1

    def describe(self) -> str:
        return repr(self.text if len(self.text) <= 60 else self.text[:59] + "…")


@dataclass(frozen=True)
class GeneratorInput:
    ref: Ref

    def describe(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.ref.params.items())
        return f"{self.ref}?{query}" if query else str(self.ref)


InputSource = FileInput | MessageInput | GeneratorInput

_PATH_PREFIXES = ("./", "../", "~/", ".\\", "..\\")
_PATH_SUFFIXES = ("/", "\\")


def parse_input(arg: str) -> InputSource:
    """Classify one `-i` value. Raises InputError for what cannot be meant."""
    text = arg.strip()
    if not text:
        raise InputError(InputProblem("-i is empty: give a file, a message or agents:/scripts:ID"))
    head = text.split(":", 1)[0]
    if ":" in text and head in ("agents", "scripts"):
        try:
            return GeneratorInput(parse_ref(text, allow_params=True))
        except ValueError as exc:
            raise InputError(InputProblem(str(exc), field="-i")) from None
    # Paths stay as the user wrote them (relative to the working directory), so that
    # error messages name the file the way the user knows it.
    path = Path(text).expanduser()
    if path.exists():
        return FileInput(path)
    # A single word ending in a case-file extension is a mistyped path, not a message
    # anybody means to send to an agent; so is one written as a relative path or a folder
    # (`./tests/`), which would otherwise run as a message with no assertions and pass.
    if not any(c.isspace() for c in text):
        if path.suffix.lower() in CASE_SUFFIXES:
            raise InputError(InputProblem(f"case file not found: {text}", field="-i"))
        if text.startswith(_PATH_PREFIXES) or text.endswith(_PATH_SUFFIXES):
            raise InputError(InputProblem(f"case file or folder not found: {text}", field="-i"))
    return MessageInput(text)


def parse_inputs(values: Iterable[str]) -> tuple[list[InputSource], list[InputProblem]]:
    """Every -i value classified, with the problems of all of them (not just the first)."""
    sources: list[InputSource] = []
    problems: list[InputProblem] = []
    messages = 0
    for value in values:
        try:
            source = parse_input(value)
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        if isinstance(source, MessageInput):
            messages += 1
            source = replace(source, number=messages)
        sources.append(source)
    return sources, problems
