"""A large case file checked on two cores: its second half in a process of its own.

Checking a case (reading its line, validating it, its references, its record) costs
~40 µs on one core, and no case is stored before every case is checked: a
1,000,000-case file was checked on one core while the other waited. A .jsonl file of
at least SPLIT_BYTES is split at a line past its middle; a child process
(`check_part.py`) checks the second half while this one checks the first, each with
the same `CaseChecker` and `SpoolWriter`.

The child knows nothing of the other cases: it sends back, in input order, each
problem it found and, for each case read, its id and line with what checking it found
(`CaseEvent`), and the spool lines of the cases it kept. `expand.CaseStream` replays
those events after its own half as if it had read them itself: it finds duplicate ids
(across the halves too), drops what a duplicate's own checks found, and lists every
problem where it would have; the spool lines are appended after the first half's.
So the problems, their order and the stored bytes are those of one process.

If the child cannot do its part (it fails to start or exits with an error), this
process checks the second half itself: slower, never different. Files under
SPLIT_BYTES are not split: a process start (~0.4 s of a core) would cost more than it
saves.
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from agenttest_submit.case_checks import CaseChecker
from agenttest_submit.spool_lines import SpoolShape, SpoolWriter
from agenttest_worker.assertions import assertion_types
from agenttest_worker.cases.files import CASE_SUFFIXES, half_way
from agenttest_worker.errors import InputProblem

# Files at least this large are split (~60,000 single-turn cases, ~2.5 s of checking).
SPLIT_BYTES = 8 << 20

# A case read by the child: (id, line, kept) when checking it found nothing, else
# (id, line, kept, problems, warnings). `kept`: selected and free of problems.
CaseEvent = tuple[str, int, bool] | tuple[str, int, bool, list[InputProblem], list[str]]
Event = InputProblem | CaseEvent

# Events are written to the child's events file in lists of this many.
EVENT_BATCH = 4096


@dataclass(frozen=True)
class PartJob:
    """What the child checks, and how, sent to it pickled on its stdin."""

    path: str
    start: int
    first_line: int
    checker: CaseChecker
    shape: SpoolShape
    # The assertion types the parent knows: a type registered at run time (a plugin,
    # a test) is unknown to a fresh interpreter, which then leaves the part to it.
    assertion_types: tuple[str, ...]


@dataclass(frozen=True)
class PartTotals:
    """The last object of the events file: what the child's spool writer counted."""

    cases: int
    conversations: int
    repeated: list[tuple[str, str]]


class CheckedPart:
    """The second half of a file, checked by the child: its events, totals and lines."""

    def __init__(self, file: str, events: IO[bytes], spool: IO[bytes]) -> None:
        self.file = file
        self._events = events
        self._spool = spool
        self.totals: PartTotals | None = None

    def events(self) -> Iterator[Event]:
        """Every event in input order; `totals` is set once they are all read."""
        self._events.seek(0)
        while True:
            item = pickle.load(self._events)
            if isinstance(item, PartTotals):
                self.totals = item
                return
            yield from item

    def append_to(self, writer: SpoolWriter) -> None:
        """Add the part's spool lines and counts to `writer`'s (after `events`)."""
        assert self.totals is not None, "the events are read first"
        writer.handle.flush()
        self._spool.seek(0)
        shutil.copyfileobj(self._spool, writer.handle, 1 << 20)
        writer.cases += self.totals.cases
        writer.conversations += self.totals.conversations
        writer.repeated.extend(self.totals.repeated)


class SecondHalf:
    """The child checking a file's second half (from byte `start`, line `first_line`)."""

    def __init__(self, path: Path, start: int, first_line: int, job: PartJob) -> None:
        self.path, self.start, self.first_line = path, start, first_line
        # Closed by close(): the files outlive this constructor on purpose.
        self._spool = tempfile.TemporaryFile("w+b")  # noqa: SIM115
        self._events = tempfile.TemporaryFile("w+b")  # noqa: SIM115
        fds = (self._spool.fileno(), self._events.fileno())
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "agenttest_submit.check_part", *map(str, fds)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                # Its errors are not the user's: on any, this process checks the part.
                stderr=subprocess.DEVNULL,
                pass_fds=fds,
            )
            assert self._proc.stdin is not None
            with self._proc.stdin as stdin:
                pickle.dump(job, stdin)
        except BaseException as exc:
            self.close()
            if not isinstance(exc, Exception):
                raise  # stopped (Ctrl-C); else no child (no interpreter...): checked here

    def finish(self) -> CheckedPart | None:
        """The checked part once the child is done, or None if it could not do it."""
        if self._proc is None or self._proc.wait() != 0:
            return None
        return CheckedPart(str(self.path), self._events, self._spool)

    def close(self) -> None:
        """Stop the child if it still runs (the submitter stopped first), drop its files."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._spool.close()
        self._events.close()

    def __enter__(self) -> SecondHalf:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def start_second_half(path: Path, checker: CaseChecker, shape: SpoolShape) -> SecondHalf | None:
    """The child started on the file's second half, or None when it is not split."""
    if CASE_SUFFIXES.get(path.suffix.lower()) != "jsonl":
        return None
    try:
        if path.stat().st_size < SPLIT_BYTES:
            return None
    except OSError:
        return None  # the reader reports it
    found = half_way(path)
    if found is None:
        return None
    start, first_line = found
    job = PartJob(str(path), start, first_line, checker, shape, assertion_types())
    return SecondHalf(path, start, first_line, job)
