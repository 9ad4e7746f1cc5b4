"""What every reporter renders: the results of one run plus what the header shows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agenttest_worker.results import CaseResult

DEFAULT_TITLE = "Agent Test (Multi-Turn)"


@dataclass(frozen=True)
class Summary:
    """Counts over a run's results, as the console "Summary" section shows them."""

    total: int
    passed: int
    failed: int
    skipped: int
    total_turns: int
    avg_turns: float
    duration_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunReport:
    """One run's results and the context a reporter needs around them.

    `total_cases` is how many cases the input expanded to; it can exceed
    `len(results)` when a run is reported before it finishes or stopped early
    (--fail-fast), so the header and the summary may differ on purpose.
    """

    results: list[CaseResult]
    agent: str | None
    input_label: str
    total_cases: int
    duration_s: float
    verbose: bool = False
    run_id: str | None = None
    title: str = DEFAULT_TITLE
    # case id -> simulator name, for the "(simulator: NAME)" case header
    simulators: dict[str, str] = field(default_factory=dict)
    color: bool = False
    # Reports already rendered from this report as it stands (format -> text), kept by
    # the aggregator so that a submitter printing the same thing does not render twice.
    rendered: dict[str, str] = field(default_factory=dict)

    def summary(self) -> Summary:
        total = len(self.results)
        statuses = [case.status for case in self.results]
        total_turns = sum(case.total_turns for case in self.results)
        return Summary(
            total=total,
            passed=statuses.count("passed"),
            failed=statuses.count("failed"),
            skipped=statuses.count("skipped"),
            total_turns=total_turns,
            avg_turns=round(total_turns / total, 2) if total else 0.0,
            duration_s=self.duration_s,
        )
