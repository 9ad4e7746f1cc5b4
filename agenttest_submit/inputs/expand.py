"""Turn `-i` inputs into validated cases, collecting every problem before anything runs."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agenttest_submit.inputs.case_checks import CaseChecker, RerunIds, Selection
from agenttest_submit.inputs.generate import PoolMaker, generate_cases
from agenttest_submit.inputs.golden_inputs import GoldenUse
from agenttest_submit.inputs.sources import (
    STDIN_NAME,
    FileInput,
    GeneratorInput,
    InputSource,
    MessageInput,
    StdinInput,
)
from agenttest_submit.inputs.spool_lines import (
    TARGET_SEPARATOR,
    SpoolShape,
    SpoolWriter,
    spooled_records,
)
from agenttest_worker.agents import ProjectConfig
from agenttest_worker.cases import Case, case_files_in, iter_cases, iter_stream_cases
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import printable
from agenttest_worker.store import CaseRecord, StoredCase

__all__ = [
    "CaseStream",
    "Expansion",
    "RerunIds",
    "Selection",
    "Spool",
    "expand",
    "print_warnings",
]


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
    source: InputSource,
    config: ProjectConfig,
    target: str | None = None,
    generators: PoolMaker | None = None,
) -> Iterator[Case | InputProblem]:
    if isinstance(source, FileInput):
        for file in case_files_in(source.path):
            yield from iter_cases(file)
    elif isinstance(source, MessageInput):
        yield message_case(source.text, source.number)
    elif isinstance(source, GeneratorInput):
        yield from generate_cases(source, config, target, generators)
    elif isinstance(source, StdinInput):
        yield from iter_stream_cases(sys.stdin.buffer, STDIN_NAME)


# How many files `CaseStream._place` numbers within an int.
_FILE_NUMBERS = 1 << 16
# How many of a rerun's cases gone from the inputs its warning names.
_GONE_SHOWN = 10


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
        generators: PoolMaker | None = None,
        golden: GoldenUse | None = None,
    ) -> None:
        self.sources = list(sources)
        # The pool `agents:` generators are called through (None: one without a cache).
        self.generators = generators
        self.config = config
        self.target = target
        self.simulator = simulator
        self.selection = selection or Selection()
        self.checker = CaseChecker(config, target, simulator, self.selection, golden or GoldenUse())
        self.problems: list[InputProblem] = []
        self.warnings: list[str] = []
        self.count = 0
        # Where each id was first defined, for a later duplicate's message, as a number
        # standing for its file and line (`_place`): the text "file:line" for each id
        # would grow with a million-case file.
        self._seen: dict[str, int | str] = {}
        self._files: dict[str, int] = {}

    def __iter__(self) -> Iterator[Case]:
        for source in self.sources:
            try:
                for item in iter_source(source, self.config, self.target, self.generators):
                    if isinstance(item, InputProblem):
                        self._take_problem(item)
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

    def _take_problem(self, problem: InputProblem) -> None:
        self.problems.append(problem)
        if problem.case_id is not None:  # a bad case still takes its id
            self._seen.setdefault(problem.case_id, self._place(problem.file, problem.line))

    def _is_new(self, case_id: str, file: str | None, line: int | None) -> bool:
        """Whether no case before has this id (else the duplicate is a problem); the id
        is then taken."""
        if case_id in self._seen:
            first = self._where(self._seen[case_id])
            self.problems.append(
                InputProblem(
                    f"duplicate id {case_id!r} (first defined at {first})",
                    file=file,
                    line=line,
                    field="id",
                )
            )
            return False
        self._seen[case_id] = self._place(file, line)
        return True

    def _check(self, case: Case) -> Case | None:
        if not self._is_new(case.id, case.source_file, case.source_line):
            return None
        return self.checker.check(case, self.problems, self.warnings)

    def finish(self) -> None:
        """Raise the problems found while iterating (every one), or for no cases at all
        (a rerun's selection may be empty: the caller checks `count`)."""
        if self.problems:
            raise InputError(self.problems)
        rerun = self.selection.rerun
        if rerun is not None:
            self._warn_gone(rerun)
        if not self.count and (self.selection.tags or self.selection.ids) and rerun is None:
            raise InputError(InputProblem("no case matches the --tag/--id selection"))
        missing = [i for i in dict.fromkeys(self.selection.ids) if i not in self._seen]
        if missing:
            self.warnings.append(f"--id {', '.join(missing)}: no such case in the input")
        if not self.count and (rerun is None or not self._seen):
            # An empty (or truncated) case file would otherwise "pass" in CI with 0 tests.
            raise InputError(InputProblem("no test cases in the input", field="-i"))
        # A rerun that selects none of the cases is no error: its caller says so and
        # runs nothing.

    def _warn_gone(self, rerun: RerunIds) -> None:
        """The rerun's cases that are no longer in the inputs (removed or renamed)."""
        gone = [i for i in rerun.ids if i not in self._seen]
        if gone:
            shown = ", ".join(gone[:_GONE_SHOWN])
            more = f" and {len(gone) - _GONE_SHOWN} more" if len(gone) > _GONE_SHOWN else ""
            self.warnings.append(
                f"{rerun.flag}: {len(gone)} {rerun.what} case(s) of run {rerun.run_id} are "
                f"no longer in the inputs, not run: {shown}{more}"
            )


class Spool:
    """Checked cases written to a temporary file, to be read back once all are valid.

    Checking a case (parsing, validation, references) costs far more than reading its
    normalized record back; spooling lets a run reject bad input before it stores or
    runs anything, without holding a 100,000-case file in memory. The lines are
    spool_lines.py's.
    """

    def __init__(
        self,
        stream: CaseStream,
        target: str | None,
        *,
        sources: bool = True,
        repeat: int | None = None,
        adaptive: bool = False,
        targets: tuple[str, ...] = (),
    ) -> None:
        """`sources`: a run's records (where each case is written, and each repetition
        of a repeated case its own conversation) rather than --dry-run's cases as
        written. `repeat`: --repeat, over each case's own `repeat`; `adaptive`: --repeat
        auto (`repeat` the most); `targets`: -n given more than once (spool_lines.py)."""
        # Closed by close() / __exit__: the spool outlives this constructor on purpose.
        self.handle = tempfile.NamedTemporaryFile("w+b", prefix="agenttest-spool-")  # noqa: SIM115
        writer = SpoolWriter(self.handle, SpoolShape(target, sources, repeat, adaptive, targets))
        for case in stream:
            writer.add(case)
        if writer.own_agent:
            shown = ", ".join(writer.own_agent[:_GONE_SHOWN])
            more = len(writer.own_agent) - _GONE_SHOWN
            stream.warnings.append(
                f"{len(writer.own_agent)} case(s) name their own agent and are played against "
                f"it only, not against each -n target: {shown}"
                + (f" and {more} more" if more > 0 else "")
            )
        self.cases = writer.cases
        self.conversations = writer.conversations
        stream.finish()
        # A case whose id is another's repetition key ("T1#2" beside "T1" played 3
        # times) would share its conversation: refused before anything runs.
        clashes = [
            InputProblem(
                f"case id {key!r} is also the key of {_played_as(key)} of case {case_id!r}: "
                "rename it",
                field="id",
                test=key,
            )
            for key, case_id in writer.repeated
            if stream.has_id(key)
        ]
        if clashes:
            raise InputError(clashes)
        # Every id is checked: what the stream kept of them (a million-case file's ids
        # and places) is not needed while the run is stored.
        stream.forget_ids()
        self.handle.flush()

    @property
    def repeated(self) -> bool:
        """Whether some case is played more than once."""
        return self.conversations > self.cases

    def records(self) -> Iterator[CaseRecord]:
        """(conversation key, agent, normalized record) of every conversation, in input
        order (a case's key is its id; a repetition's, `repetition_key`). Each call
        reads the spool on a handle of its own: an embedded run plays the cases from
        one while its store writes them from another."""
        with open(self.handle.name, "rb") as handle:
            for line in handle:
                head, _, record = line.partition(b"\t")
                case_id, agent, *_ = json.loads(head)
                yield case_id, agent, json.loads(record)

    def stored_records(self) -> Iterator[StoredCase]:
        """The same as `records`, each record as the text a run stores, not parsed."""
        with open(self.handle.name, "rb") as handle:
            yield from spooled_records(handle)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _played_as(key: str) -> str:
    """ "repetition 2", "target A", "repetition 2 with target A": what a conversation
    key names beside its case id."""
    head, hashed, number = key.rpartition("#")
    base = head if hashed and number.isdigit() else key
    said = [f"repetition {number}"] if base != key else []
    if TARGET_SEPARATOR in base:
        said.append(("with " if said else "") + f"target {base.rsplit(TARGET_SEPARATOR, 1)[1]}")
    return " ".join(said)


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


def print_warnings(warnings: list[str]) -> None:
    # A warning quotes the cases (ids, connector names): escaped, so it cannot command
    # the terminal.
    for warning in dict.fromkeys(warnings):
        print(f"warning: {printable(warning)}", file=sys.stderr)


def resolve_path(text: str) -> Path:
    return Path(text).expanduser()
