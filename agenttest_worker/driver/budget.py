"""Run budgets: tokens and cost, counted from every agent call's usage.

Cost is computed from each agent's `pricing` in agenttest.yaml (per million prompt and
completion tokens); agents without pricing cost nothing. The run's totals move with
each saved turn when a budget is set, and a turn that would start after the budget is
spent is not started: its case ends skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.engine import RunOptions
from agenttest_worker.results import AgentCallRecord, TurnResult


def calls_cost(calls: Iterable[AgentCallRecord], config: ProjectConfig) -> float:
    cost = 0.0
    for call in calls:
        agent = config.agents.get(call.agent)
        if call.usage is None or agent is None or agent.pricing is None:
            continue
        cost += call.usage.prompt_tokens * agent.pricing.prompt_per_million / 1e6
        cost += call.usage.completion_tokens * agent.pricing.completion_per_million / 1e6
    return cost


def turns_spend(turns: Iterable[TurnResult], config: ProjectConfig) -> tuple[int, float]:
    """(tokens, cost) of what these turns' calls used."""
    tokens, cost = 0, 0.0
    for turn in turns:
        calls = turn.calls or []
        tokens += sum(c.usage.total_tokens for c in calls if c.usage is not None)
        cost += calls_cost(calls, config)
    return tokens, cost


def budget_spent(options: RunOptions, tokens: int, cost: float) -> str | None:
    """Why no new turn may start, or None while the budget lasts."""
    if options.max_tokens is not None and tokens >= options.max_tokens:
        return (
            f"not run: the run's token budget ({options.max_tokens:,}) was spent ({tokens:,} used)"
        )
    if options.max_cost is not None and cost >= options.max_cost:
        return f"not run: the run's cost budget ({options.max_cost:g}) was spent ({cost:.4f} used)"
    return None
