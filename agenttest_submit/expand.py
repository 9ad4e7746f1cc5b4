"""Turn `-i` inputs into validated cases, collecting every problem before anything runs."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenttest_submit.generate import generate_cases
from agenttest_submit.inputs import FileInput, GeneratorInput, InputSource, MessageInput
from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.assertions import AgentAssertion
from agenttest_worker.cases.attachments import inline_attachments
from agenttest_worker.cases.checks import check_case_refs
from agenttest_worker.cases.files import case_files_in, iter_cases
from agenttest_worker.cases.model import Case, repetition_key
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.json_values import dumps
from agenttest_worker.report.common import printable
from agenttest_worker.store.steps import CaseRecord, CaseText, StoredCase


@dataclass
class Selection:
    """What the user asked to run of the cases found (--tag, --id)."""

    tags: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def wants(self, case: Case) -> bool:
        if self.ids and case.id not in self.ids:
            return False
        return not self.tags or bool(set(self.tags) & set(case.tags))


@dataclass
class Expansion:
    cases: list[Case]
    warnings: list[str]


def message_case(text: str, number: int = 1) -> Case:
    """A direct `-i "message"`: one single-turn case with no assertions.

    Its id is `message`, then `message-2`, `message-3`... for further messages.
    """
    name = text if len(text) <= 60 else text[:59] + "…"
    return Case(id="message" if number == 1 else f"message-{number}", name=name, input=text)


def iter_source(
    source: InputSource, config: ProjectConfig, target: str | None = None
) -> Iterator[Case | InputProblem]:
    if isinstance(source, FileInput):
        for file in case_files_in(source.path):
            yield from iter_cases(file)
    elif isinstance(source, MessageInput):
        yield message_case(source.text, source.number)
    elif isinstance(source, GeneratorInput):
        yield from generate_cases(source, config, target)


# How many files `CaseStream._place` numbers within an int.
_FILE_NUMBERS = 1 << 16


class CaseStream:
    """The checked cases of the inputs, one at a time, problems collected on the way.

    Nothing is held but each case's id (for duplicates), so a 100,000-case file streams
    through in constant memory. Iterate once, then call `finish()`: it raises an
    InputError listing every problem found (and for an empty input), so a caller that
    stored cases while iterating can undo that before anything runs.
    """

    def __init__(
        self,
        sources: Iterable[InputSource],
        config: ProjectConfig,
        *,
        target: str | None,
        simulator: str | None = None,
        selection: Selection | None = None,
    ) -> None:
        self.sources = list(sources)
        self.config = config
        self.target = target
        self.simulator = simulator
        self.selection = selection or Selection()
        self.problems: list[InputProblem] = []
        self.warnings: list[str] = []
        self.count = 0
        # Where each id was first defined, for a later duplicate's message, as a number
        # standing for its file and line (`_place`): the text "file:line" for each id
        # cost a million-case file ~60 MB more.
        self._seen: dict[str, int | str] = {}
        self._files: dict[str, int] = {}

    def __iter__(self) -> Iterator[Case]:
        for source in self.sources:
            try:
                for item in iter_source(source, self.config, self.target):
                    if isinstance(item, InputProblem):
                        self.problems.append(item)
                        if item.case_id is not None:  # a bad case still takes its id
                            self._seen.setdefault(item.case_id, self._place(item.file, item.line))
                    elif (case := self._check(item)) is not None:
                        self.count += 1
                        yield case
            except InputError as exc:
                self.problems.extend(exc.problems)

    def has_id(self, case_id: str) -> bool:
        """Whether some case of the input (selected or not) has this id."""
        return case_id in self._seen

    def forget_ids(self) -> None:
        """Drop the ids kept for duplicates, once iterating and `has_id` are over."""
        self._seen = {}

    def _place(self, file: str | None, line: int | None) -> int | str:
        """Where a case is, as `_where` reads it back: its line and its file's number in
        one int (line 0 for none), or "input" for a case that is in no file."""
        if not file:
            return "input"
        number = self._files.setdefault(file, len(self._files))
        if number >= _FILE_NUMBERS:  # so many files: the place as text
            return f"{file}:{line}"
        return (line or 0) * _FILE_NUMBERS + number

    def _where(self, place: int | str) -> str:
        if isinstance(place, str):
            return place
        line, number = divmod(place, _FILE_NUMBERS)
        file = next(name for name, n in self._files.items() if n == number)
        return f"{file}:{line or None}"

    def _check(self, case: Case) -> Case | None:
        if case.id in self._seen:
            first = self._where(self._seen[case.id])
            self.problems.append(
                InputProblem(
                    f"duplicate id {case.id!r} (first defined at {first})",
                    file=case.source_file,
                    line=case.source_line,
                    field="id",
                )
            )
            return None
        self._seen[case.id] = self._place(case.source_file, case.source_line)
        if not self.selection.wants(case):
            return None
        if self.simulator is not None:
            case = case.with_default_simulator(self.simulator)
        case = case.with_simulator_named(self.config.defaults.simulator)
        found = list(check_case_refs(case, self.config, self.target))
        self.problems.extend(found)
        self.warnings.extend(_case_warnings(case, self.config))
        try:
            case = inline_attachments(case)
        except InputError as exc:
            self.problems.extend(exc.problems)
            return None
        return None if found else case

    def finish(self) -> None:
        """Raise the problems found while iterating (every one), or for no cases at all."""
        if self.problems:
            raise InputError(self.problems)
        if not self.count and (self.selection.tags or self.selection.ids):
            raise InputError(InputProblem("no case matches the --tag/--id selection"))
        missing = [i for i in dict.fromkeys(self.selection.ids) if i not in self._seen]
        if missing:
            self.warnings.append(f"--id {', '.join(missing)}: no such case in the input")
        if not self.count:
            # An empty (or truncated) case file would otherwise "pass" in CI with 0 tests.
            raise InputError(InputProblem("no test cases in the input", field="-i"))


class Spool:
    """Checked cases written to a temporary file, to be read back once all are valid.

    Checking a case (parsing, validation, references) costs far more than reading its
    normalized record back; spooling lets a run reject bad input before it stores or
    runs anything, without holding a 100,000-case file in memory.
    """

    def __init__(
        self,
        stream: CaseStream,
        target: str | None,
        *,
        sources: bool = True,
        repeat: int | None = None,
    ) -> None:
        """`sources`: a run's records (where each case is written, and each repetition
        of a repeated case its own conversation) rather than --dry-run's cases as
        written. `repeat`: --repeat, over each case's own `repeat`."""
        # Closed by close() / __exit__: the spool outlives this constructor on purpose.
        self.handle = tempfile.TemporaryFile("w+b")  # noqa: SIM115
        self.cases = 0
        self.conversations = 0
        # (repetition key, its case): checked against every case id once all are read.
        repeated: list[tuple[str, str]] = []
        for case in stream:
            self.cases += 1
            agent = case.agent or target
            if not sources:
                self._write(case.id, agent, None, case.to_record())
                continue
            record = case.to_run_record()
            times = repeat or case.repeat or 1
            if times == 1:
                record.pop("repeat", None)
                self._write(case.id, agent, None, record)
                continue
            # Each repetition is a conversation of its own (own key, so own session
            # id, its own chain on a fleet), stored one after the other.
            record["repeat"] = times
            for number in range(1, times + 1):
                key = repetition_key(case.id, number)
                repeated.append((key, case.id))
                self._write(key, agent, case.id, {**record, "repetition": number})
        stream.finish()
        # A case whose id is another's repetition key ("T1#2" beside "T1" played 3
        # times) would share its conversation: refused before anything runs.
        clashes = [
            InputProblem(
                f"case id {key!r} is also the key of repetition {key.rsplit('#', 1)[1]} of "
                f"case {case_id!r}: rename it",
                field="id",
                test=key,
            )
            for key, case_id in repeated
            if stream.has_id(key)
        ]
        if clashes:
            raise InputError(clashes)
        # Every id is checked: what the stream kept of them (a million-case file's ids
        # and places, ~100 MB) is not needed while the run is stored.
        stream.forget_ids()
        self.handle.seek(0)

    @property
    def repeated(self) -> bool:
        """Whether some case is played more than once."""
        return self.conversations > self.cases

    def _write(self, key: str, agent: str | None, test_id: str | None, record: Any) -> None:
        # One line per conversation: [key, agent, test id], a tab, then the record as
        # the store writes it (json.dumps's text), so that a fleet's run stores that text as
        # it is (`stored_records`). JSON written by json.dumps holds no raw tab.
        head = dumps([key, agent, test_id]).encode("ascii")
        self.handle.write(head + b"\t" + dumps(record).encode("ascii") + b"\n")
        self.conversations += 1

    def records(self) -> Iterator[CaseRecord]:
        """(conversation key, agent, normalized record) of every conversation, in input
        order (a case's key is its id; a repetition's, `repetition_key`)."""
        self.handle.seek(0)
        for line in self.handle:
            head, _, record = line.partition(b"\t")
            case_id, agent, _ = json.loads(head)
            yield case_id, agent, json.loads(record)

    def stored_records(self) -> Iterator[StoredCase]:
        """The same as `records`, each record as the text a run stores, not parsed."""
        self.handle.seek(0)
        for line in self.handle:
            head, _, record = line.partition(b"\t")
            case_id, agent, test_id = json.loads(head)
            yield case_id, agent, CaseText(record[:-1].decode("ascii"), test_id)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def expand(
    sources: Iterable[InputSource],
    config: ProjectConfig,
    *,
    target: str | None,
    simulator: str | None = None,
    selection: Selection | None = None,
) -> Expansion:
    """Load, check and select cases into memory; raises InputError listing every problem."""
    stream = CaseStream(sources, config, target=target, simulator=simulator, selection=selection)
    cases = list(stream)
    stream.finish()
    return Expansion(cases, stream.warnings)


def _case_warnings(case: Case, config: ProjectConfig) -> Iterator[str]:
    """What is allowed but probably not meant: it runs, differently than it reads."""
    layers = [case.options, *(t.options for t in case.turns)]
    for options in layers:
        if options is not None and options.connector and options.connector not in config.agents:
            yield (
                f"case {case.id}: connector {options.connector!r} is not an agent in "
                "agenttest.yaml; the case's own target is used"
            )
    for assertion in case.iter_assertions():
        options = assertion.options if isinstance(assertion, AgentAssertion) else None
        if options is not None and options.connector and options.connector not in config.agents:
            yield (
                f"case {case.id}: judge connector {options.connector!r} is not an agent in "
                "agenttest.yaml; the judge's own agent is called"
            )


def print_warnings(warnings: list[str]) -> None:
    # A warning quotes the cases (ids, connector names): escaped, so it cannot command
    # the terminal.
    for warning in dict.fromkeys(warnings):
        print(f"warning: {printable(warning)}", file=sys.stderr)


def resolve_path(text: str) -> Path:
    return Path(text).expanduser()
