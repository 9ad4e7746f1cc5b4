"""The embedded run's row as the embedded store keeps it in memory (`BufferedRun`), and
what a flush writes to it besides its counters (`RunChanges`). No SQLAlchemy: see
buffered.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.results import RoleUsage, UsageRole, add_usage


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
class RunChanges:
    """What a flush writes to the run row besides its counters: a cancel's reason, and
    the calls of steps played but not saved (`add_unrecorded_usage`)."""

    cancel: str | None = None
    usage: dict[UsageRole, RoleUsage] = field(default_factory=dict)
    # Conversations added since (repetitions of --repeat auto, repetition_chain.py), in
    # order: (key, the stored repetition its row is copied from, its case record's text).
    added: list[tuple[str, str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.cancel is not None or bool(self.usage) or bool(self.added)

    def add(self, later: RunChanges) -> None:
        """Fold `later` in (a failed flush's changes put back before newer ones)."""
        self.cancel = self.cancel or later.cancel
        add_usage(self.usage, later.usage)
        self.added += later.added
