"""The `-i` argument, parsed exactly as the spec's "Input Sources" section.

./tests.jsonl | ./tests/           a case file (by extension) or a folder of them
-                                  JSONL cases read from standard input
"Hello, how are you?"              a direct message (not an existing path; needs -n)
agents:ID?count=10&focus=x         cases from a generator agent
scripts:ID?scenario=y              cases from a generator script

A value that names nothing but looks like a path (it has a `/`, a file extension, or
is one lower-case word such as `nosuchdir`) is an input error naming it: run as a
message it would be a one-case suite with no assertions that passes. `-m TEXT` sends
a message with no guessing at all (`message_sources`).

`parse_inputs` classifies every -i value of a run, with the problems of all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from agenttest_worker.agents import Ref, parse_ref
from agenttest_worker.cases import CASE_SUFFIXES
from agenttest_worker.errors import MASK, InputError, InputProblem, is_secret_param


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
        """The reference as a label or a suite name shows it: key-like parameters
        (`api_key=...`) masked, as in every URL agenttest prints."""
        query = "&".join(
            f"{k}={MASK if is_secret_param(k) else v}" for k, v in self.ref.params.items()
        )
        return f"{self.ref}?{query}" if query else str(self.ref)


@dataclass(frozen=True)
class StdinInput:
    """`-i -`: JSONL cases read from standard input (once, before anything runs)."""

    def describe(self) -> str:
        return STDIN_NAME


STDIN_NAME = "<stdin>"

InputSource = FileInput | MessageInput | GeneratorInput | StdinInput

_PATH_PREFIXES = ("./", "../", "~/", ".\\", "..\\", "/", "~")
_PATH_SUFFIXES = ("/", "\\")
# One word as file and folder names are written (lower case, digits, `_`, `-`, `.`),
# or anything ending in a short extension: a name, not a sentence for an agent.
_FILE_NAME = re.compile(r"[a-z0-9_][a-z0-9_.\-]*|\S+\.[A-Za-z0-9]{1,5}")


def parse_input(arg: str) -> InputSource:
    """Classify one `-i` value. Raises InputError for what cannot be meant."""
    text = arg.strip()
    if not text:
        raise InputError(InputProblem("-i is empty: give a file, a message or agents:/scripts:ID"))
    if text == "-":
        return StdinInput()
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
    one_word = not any(c.isspace() for c in text)
    if one_word and path.suffix.lower() in CASE_SUFFIXES:
        raise InputError(InputProblem(f"case file not found: {text}", field="-i"))
    if text.startswith(_PATH_PREFIXES):
        raise InputError(InputProblem(f"case file or folder not found: {text}", field="-i"))
    if one_word:
        if "/" in text or "\\" in text:
            raise InputError(InputProblem(f"case file or folder not found: {text}", field="-i"))
        if _FILE_NAME.fullmatch(text):
            raise InputError(
                InputProblem(
                    f"no case file or folder named {text!r}; to send it to the agent as a "
                    f"message: -m {text!r}",
                    field="-i",
                )
            )
    return MessageInput(text)


def parse_inputs(
    values: Iterable[str], messages: Iterable[str] = ()
) -> tuple[list[InputSource], list[InputProblem]]:
    """Every -i value classified, then every -m message as it is, with the problems of
    all of them (not just the first)."""
    sources: list[InputSource] = []
    problems: list[InputProblem] = []
    for value in values:
        try:
            source = parse_input(value)
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        if isinstance(source, StdinInput) and source in sources:
            problems.append(
                InputProblem("standard input (-i -) can be read once: give it once", field="-i")
            )
            continue
        sources.append(source)
    for text in messages:
        if not text.strip():
            problems.append(InputProblem("is empty: give the message to send", field="-m"))
        else:
            sources.append(MessageInput(text))
    numbered, count = [], 0
    for source in sources:
        if isinstance(source, MessageInput):
            count += 1
            source = replace(source, number=count)
        numbered.append(source)
    return numbered, problems
