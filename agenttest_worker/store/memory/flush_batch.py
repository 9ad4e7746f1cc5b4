"""What one flush of the embedded store writes, as plain data (no SQLAlchemy).

`BufferedStore` (buffered.py) keeps a run's conversations in memory and hands what
changed since its last flush to `flush_writes.write_flush` as a `FlushBatch`, on the
store's thread: nothing here imports the database's modules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from agenttest_worker.results import RoleUsage, UsageRole, add_usage
from agenttest_worker.store import steps


@dataclass(frozen=True)
class Unplayed:
    """The conversations never started, from submission position `from_seq` on, ended
    failed with `reason` (BufferedStore.end_unadmitted)."""

    from_seq: int
    reason: str


@dataclass
class RunChanges:
    """What a flush writes to the run row besides its counters: a cancel's reason, the
    calls of steps played but not saved (`add_unrecorded_usage`), and the conversations
    never started that end at once (`unplayed`)."""

    cancel: str | None = None
    usage: dict[UsageRole, RoleUsage] = field(default_factory=dict)
    # Conversations added since (repetitions of --repeat auto, repetition_chain.py), in
    # order: (key, the stored repetition its row is copied from, its case record's text).
    added: list[tuple[str, str, str]] = field(default_factory=list)
    unplayed: Unplayed | None = None

    def __bool__(self) -> bool:
        return (
            self.cancel is not None
            or bool(self.usage)
            or bool(self.added)
            or self.unplayed is not None
        )

    def add(self, later: RunChanges) -> None:
        """Fold `later` in (a failed flush's changes put back before newer ones)."""
        self.cancel = self.cancel or later.cancel
        add_usage(self.usage, later.usage)
        self.added += later.added
        self.unplayed = self.unplayed or later.unplayed


class StepRecord(NamedTuple):
    """A case's record as written (pydantic's JSON text) and what the counters take."""

    text: steps.JsonText
    status: str
    total_turns: int


class CaseValues(NamedTuple):
    """A conversation's row as a flush writes it (its `cases` columns that steps move)."""

    next_turn: int
    phase: str
    state: steps.JsonDocument | None
    result: StepRecord | None


class BufferedStep(NamedTuple):
    """A saved step not yet written: the conversation as it left it, and what it adds."""

    turn: int  # the turn it ran (its guard)
    next_turn: int
    phase: str
    state: steps.JsonDocument
    result: StepRecord | None
    rows: steps.StepRows
    tokens: int
    cost: float

    def values(self) -> CaseValues:
        return CaseValues(self.next_turn, self.phase, self.state, self.result)


class CaseWrite(NamedTuple):
    """One conversation in a flush: its row as it stands, and its steps since the last
    flush (written one by one only when the database refuses the batch)."""

    case_id: str
    now: CaseValues
    steps: list[BufferedStep]


@dataclass
class RunTotals:
    """The run row's counters as the store has them in memory."""

    finished_cases: int
    total_tokens: int
    total_cost: float
    counters: dict[str, int]


class FlushBatch(NamedTuple):
    """Everything one flush writes, in one transaction."""

    run_id: str
    cases: list[CaseWrite]
    run: RunTotals
    changes: RunChanges


class StepRefused(NamedTuple):
    """The database refused step `position` (in its conversation's steps of the batch)
    of conversation `case_id` in a flush: that step and the ones after it were not
    written (flush_writes.write_flush)."""

    case_id: str
    position: int
    reason: str


class HasRunTotals(Protocol):
    finished_cases: int
    total_tokens: int
    total_cost: float
    counters: dict[str, int]


def take_off(run: HasRunTotals, dropped: Iterable[BufferedStep]) -> StepRecord | None:
    """Take steps that were not written off the run's counters: their spend, and the
    case the first of them to end it ended; that case's record, if one did."""
    ended: StepRecord | None = None
    for step in dropped:
        run.total_tokens -= step.tokens
        run.total_cost -= step.cost
        ended = ended or step.result
    if ended is not None:
        run.finished_cases -= 1
        run.counters[ended.status] -= 1
        run.counters["total_turns"] -= ended.total_turns
    return ended
