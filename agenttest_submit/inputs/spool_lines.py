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
    written (repeat_stopping.START_WIDTH), the rest start as those end. `targets`: -n
    given more than once: a case naming no agent of its own is played against each, a
    conversation (and repetitions) of its own per target, keyed `target_key`."""

    target: str | None
    sources: bool = True
    repeat: int | None = None
    adaptive: bool = False
    targets: tuple[str, ...] = ()


# Between a case id and the target its conversation plays: "T1@assistants.chat".
TARGET_SEPARATOR = "@"


def target_key(case_id: str, target: str) -> str:
    """The key of a case's conversation with one of a run's targets: "T1@A"."""
    return f"{case_id}{TARGET_SEPARATOR}{target}"


@dataclass
class SpoolWriter:
    handle: IO[bytes]
    shape: SpoolShape
    cases: int = 0
    conversations: int = 0
    # (repetition key, its case): checked against every case id once all are read.
    repeated: list[tuple[str, str]] = field(default_factory=list)
    # The ids of the cases that name their own agent in a run of several targets: each
    # is played against its own agent only (said as a warning).
    own_agent: list[str] = field(default_factory=list)

    def add(self, case: Case) -> None:
        self.cases += 1
        agent = case.agent or self.shape.target
        targets = self.shape.targets
        if len(targets) > 1 and case.agent is not None:
            self.own_agent.append(case.id)
            targets = ()
        if not self.shape.sources:
            record = case.to_record()
            if not targets:
                self._write(case.id, agent, None, record, case_definition(record))
            for target in targets:
                # --dry-run prints the cases × targets: each with the agent it plays.
                played = {**record, "agent": target}
                self._write(
                    target_key(case.id, target), target, None, played, case_definition(played)
                )
            return
        record = case.to_run_record()
        # Hashed before a target is set: the case is the same whichever target plays it.
        definition = case_definition(record)
        if not targets:
            self._add_played(case, case.id, agent, record, definition, None)
            return
        for target in targets:
            key = target_key(case.id, target)
            # A case id that is another case's target key would share its conversation.
            self.repeated.append((key, case.id))
            played = {**record, "agent": target}
            self._add_played(case, key, target, played, definition, case.id)

    def _add_played(
        self,
        case: Case,
        key: str,
        agent: str | None,
        record: dict[str, Any],
        definition: CaseDefinition,
        test_id: str | None,
    ) -> None:
        """The conversations of `case` played against `agent` under `key`: one, or one
        per repetition (keys `repetition_key(key, n)`)."""
        times = self.shape.repeat or case.repeat or 1
        if times == 1:
            record.pop("repeat", None)
            self._write(key, agent, test_id, record, definition)
            return
        # Each repetition is a conversation of its own (own key, so own session id, its
        # own chain on a fleet), stored one after the other.
        record["repeat"] = times
        written = times
        if self.shape.adaptive:
            record["max_repeat"] = times
            written = min(START_WIDTH, times)
        for number in range(1, times + 1):
            numbered = repetition_key(key, number)
            # Every key it may take is checked, those of repetitions started later too.
            self.repeated.append((numbered, case.id))
            if number <= written:
                self._write(numbered, agent, case.id, {**record, "repetition": number}, definition)

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
