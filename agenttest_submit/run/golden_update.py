"""`--update-golden`: each passing case's conversation written as its golden file.

Written by the submitting process once the run's report is built, from the run's
stored records, so that an embedded run and a fleet's record the same files. Only a
case that passed and is written in a case file is recorded; of a repeated case, its
first repetition that passed. A file is replaced whole (written aside, then renamed),
so that an interrupted update never leaves half a golden file.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agenttest_worker.assertions import (
    GoldenConversation,
    conversation_of,
    golden_folder,
    golden_name,
)
from agenttest_worker.report import printable
from agenttest_worker.results import CaseResult


@dataclass
class GoldenWrites:
    """What an update wrote, and what it left out and why."""

    written: list[Path] = field(default_factory=list)
    not_passed: int = 0
    no_case_file: int = 0


def chosen_records(
    results: Iterable[CaseResult],
) -> tuple[dict[tuple[str, str], CaseResult], GoldenWrites]:
    """The record each golden file is written from, by (case file, case id)."""
    chosen: dict[tuple[str, str], CaseResult] = {}
    seen_passing: set[tuple[str | None, str]] = set()
    failing: set[tuple[str | None, str]] = set()
    writes = GoldenWrites()
    for record in results:
        key = (record.file, record.id)
        if record.status != "passed":
            failing.add(key)
            continue
        seen_passing.add(key)
        if record.file is None or not os.path.isfile(record.file):
            continue
        had = chosen.get((record.file, record.id))
        if had is None or (record.repeat or 0) < (had.repeat or 0):
            chosen[(record.file, record.id)] = record
    writes.not_passed = len(failing - seen_passing)
    writes.no_case_file = sum(1 for f, i in seen_passing if (f or "", i) not in chosen)
    return chosen, writes


def write_golden(results: Iterable[CaseResult]) -> GoldenWrites:
    """Write the golden file of every passing case (see the module)."""
    chosen, writes = chosen_records(results)
    for (case_file, case_id), record in sorted(chosen.items()):
        folder = golden_folder(case_file)
        path = folder / golden_name(case_id)
        # golden_name is one file name, never a path: this holds by construction.
        assert path.parent == folder
        folder.mkdir(exist_ok=True)
        _replace(path, conversation_of(record))
        writes.written.append(path)
    return writes


def _replace(path: Path, conversation: GoldenConversation) -> None:
    handle, aside = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(conversation.to_json())
        os.replace(aside, path)
    except BaseException:
        Path(aside).unlink(missing_ok=True)
        raise


def say_written(writes: GoldenWrites) -> None:
    """One line on stderr for what was recorded, and one for what was not."""
    folders = sorted({str(p.parent) for p in writes.written})
    where = f" in {', '.join(printable(f) for f in folders)}" if folders else ""
    print(f"golden: {len(writes.written)} conversation(s) recorded{where}", file=sys.stderr)
    left = []
    if writes.not_passed:
        left.append(f"{writes.not_passed} case(s) did not pass")
    if writes.no_case_file:
        left.append(f"{writes.no_case_file} passing case(s) have no case file to record beside")
    if left:
        print(f"golden: not recorded: {'; '.join(left)}", file=sys.stderr)
