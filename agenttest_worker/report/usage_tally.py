"""A run's calls, tokens and cost by role, added up from its case records as they stream.

    tally = UsageTally(report.run_usage)   # what the run used outside its conversations
    for case in report.results:            # read once: a run may hold 100,000 records
        tally.add(case)
    tally.usage      # {role: RoleUsage}, roles in ROLE_ORDER, only those that made calls
    tally.as_dict()  # the same, JSON-ready: the shape of a record's `usage_by_role`
    tally.line()     # "Usage: target 120 calls, 45,000 tokens · judge 80 calls, 64 cached, ..."

Each record's `usage_by_role` (engine/outcome.py) already holds its conversation's
calls priced with the run's agenttest.yaml; the run's own usage (generator agents at
submission, a --reporter agent) comes from the stored run (`RunReport.run_usage`).
Records written before `usage_by_role` existed add nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agenttest_worker.results import COST_DIGITS, CaseResult, RoleUsage, UsageRole

# The order roles are listed in: what a run is about first, then what checks it.
ROLE_ORDER: tuple[UsageRole, ...] = ("target", "judge", "simulator", "generator", "reporter")


def ordered(usage: Mapping[UsageRole, RoleUsage]) -> dict[UsageRole, RoleUsage]:
    """`usage` with its roles in ROLE_ORDER, leaving out those that made no call."""
    return {role: usage[role] for role in ROLE_ORDER if role in usage and usage[role].calls}


def usage_dict(usage: Mapping[UsageRole, RoleUsage]) -> dict[str, dict[str, Any]]:
    """JSON-ready: {role: {calls, prompt_tokens, completion_tokens, total_tokens, cost}}."""
    return {role: found.model_dump(mode="json") for role, found in ordered(usage).items()}


def usage_line(usage: Mapping[UsageRole, RoleUsage], priced: bool | None = None) -> str:
    """One line for the console, "" when no call was made. The cost is shown when
    `priced` (None: when some call cost anything, i.e. some agent has `pricing`)."""
    shown = ordered(usage)
    if not shown:
        return ""
    if priced is None:
        priced = any(found.cost > 0 for found in shown.values())
    parts = []
    for role, found in shown.items():
        part = f"{role} {found.calls:,} call{'' if found.calls == 1 else 's'}, "
        if found.cached:
            part += f"{found.cached:,} cached, "
        part += f"{found.total_tokens:,} token{'' if found.total_tokens == 1 else 's'}"
        if priced:
            part += f", ${found.cost:,.4f}"
        parts.append(part)
    return "Usage: " + " · ".join(parts)


class UsageTally:
    """Adds up records' `usage_by_role` one by one, plus the run's own usage."""

    def __init__(self, run_usage: Mapping[UsageRole, RoleUsage] | None = None) -> None:
        # Plain numbers while adding: a RoleUsage built per record and role would be
        # most of the cost of reading 100,000 records.
        self._sums: dict[UsageRole, list[float]] = {}
        self.add_usage(run_usage or {})

    def add(self, case: CaseResult) -> None:
        self.add_usage(case.usage_by_role or {})

    def add_usage(self, usage: Mapping[UsageRole, RoleUsage]) -> None:
        for role, found in usage.items():
            sums = self._sums.get(role)
            if sums is None:
                sums = self._sums[role] = [0, 0, 0, 0, 0.0, 0]
            sums[0] += found.calls
            sums[1] += found.prompt_tokens
            sums[2] += found.completion_tokens
            sums[3] += found.total_tokens
            sums[4] += found.cost
            sums[5] += found.cached or 0

    @property
    def usage(self) -> dict[UsageRole, RoleUsage]:
        """The run's usage by role so far (roles in ROLE_ORDER, only those with calls)."""
        return ordered(
            {
                role: RoleUsage(
                    calls=int(calls),
                    prompt_tokens=int(prompt),
                    completion_tokens=int(completion),
                    total_tokens=int(total),
                    cost=round(cost, COST_DIGITS),
                    cached=int(cached) or None,
                )
                for role, (calls, prompt, completion, total, cost, cached) in self._sums.items()
            }
        )

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return usage_dict(self.usage)

    def line(self, priced: bool | None = None) -> str:
        return usage_line(self.usage, priced)


def run_usage(
    results: Iterable[CaseResult], run_usage: Mapping[UsageRole, RoleUsage] | None = None
) -> dict[UsageRole, RoleUsage]:
    """A run's usage by role: its records' (read once) plus its own (`run_usage`)."""
    tally = UsageTally(run_usage)
    for case in results:
        tally.add(case)
    return tally.usage
