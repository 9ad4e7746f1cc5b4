"""What the embedded store keeps in memory: the run's row (`BufferedRun`) and each
conversation under way (`HeldConversation`). No SQLAlchemy: see buffered.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.store import steps
from agenttest_worker.store.memory.flush_batch import CaseValues, StepRecord


@dataclass
class BufferedRun:
    """The run row: what its conversations' steps move (counters, spend, a cancel)."""

    options: dict[str, Any]
    config: dict[str, Any]
    cancelled: bool
    cancel_reason: str | None
    deadline_at: float | None
    status: str
    total_cases: int
    finished_cases: int
    total_tokens: int
    total_cost: float
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class HeldConversation:
    """A conversation as the embedded store holds it while it is played."""

    case: dict[str, Any]
    agent: str | None
    phase: str
    next_turn: int
    # As the step handed it over (often text): read back by the next step, and turned
    # into objects only for the database, once per flush.
    state: steps.JsonDocument | None
    deliveries: int
    result: StepRecord | None = None

    def values(self) -> CaseValues:
        return CaseValues(self.next_turn, self.phase, self.state, self.result)
