"""A checked case written as the spool's lines: one per conversation it becomes.

One line per conversation: `[key, agent, test id, definition hash, assertion hashes]`
(case_definitions.py, taken once per case while its record is objects), a tab, then the
record as the store writes it (json.dumps's text), so that a fleet's run stores that
text as it is (`expand.Spool.stored_records`). JSON written by json.dumps holds no raw
tab.
`spooled_records` reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from agenttest_worker.case_definitions import CaseDefinition, case_definition, stored_definition
from agenttest_worker.cases import Case, repetition_key
from agenttest_worker.report import START_WIDTH
from agenttest_worker.store import CaseText, StoredCase


@dataclass(frozen=True)
class SpoolShape:
    """How cases become conversations. `sources`: a run's records (where each case is
    written, and each repetition of a repeated case its own conversation) rather than
    --dry-run's cases as written. `repeat`: --repeat, over each case's own `repeat`.
    `adaptive`: --repeat auto, `repeat` the most: only each case's first repetitions are
    written (repeat_stopping.START_WIDTH), the rest start as those end."""

    target: str | None
    sources: bool = True
    repeat: int | None = None
    adaptive: bool = False


@dataclass
class SpoolWriter:
    handle: IO[bytes]
    shape: SpoolShape
    cases: int = 0
    conversations: int = 0
    # (repetition key, its case): checked against every case id once all are read.
    repeated: list[tuple[str, str]] = field(default_factory=list)

    def add(self, case: Case) -> None:
        self.cases += 1
        agent = case.agent or self.shape.target
        if not self.shape.sources:
            record = case.to_record()
            self._write(case.id, agent, None, record, case_definition(record))
            return
        record = case.to_run_record()
        definition = case_definition(record)
        times = self.shape.repeat or case.repeat or 1
        if times == 1:
            record.pop("repeat", None)
            self._write(case.id, agent, None, record, definition)
            return
        # Each repetition is a conversation of its own (own key, so own session id, its
        # own chain on a fleet), stored one after the other.
        record["repeat"] = times
        written = times
        if self.shape.adaptive:
            record["max_repeat"] = times
            written = min(START_WIDTH, times)
        for number in range(1, times + 1):
            key = repetition_key(case.id, number)
            # Every key it may take is checked, those of repetitions started later too.
            self.repeated.append((key, case.id))
            if number <= written:
                self._write(key, agent, case.id, {**record, "repetition": number}, definition)

    def _write(
        self,
        key: str,
        agent: str | None,
        test_id: str | None,
        record: Any,
        definition: CaseDefinition,
    ) -> None:
        head = json.dumps([key, agent, test_id, definition.hash, definition.as_dict()])
        self.handle.write(head.encode("ascii") + b"\t" + json.dumps(record).encode("ascii") + b"\n")
        self.conversations += 1


def spooled_records(handle: IO[bytes]) -> Iterator[StoredCase]:
    """(conversation key, agent, record as the text a run stores) of each line of
    `handle`, from where it stands."""
    for line in handle:
        head, _, record = line.partition(b"\t")
        case_id, agent, test_id, case_hash, assertions = json.loads(head)
        definition = stored_definition(case_hash, assertions)
        yield case_id, agent, CaseText(record[:-1].decode("ascii"), test_id, definition)
