"""What a run will call, said by `--dry-run`: calls by role and agent (cases × turns ×
judges × votes × repeats) and, for the agents whose `pricing` is set, what they would
cost.

Counted from each checked case, nothing called: a target call per turn; a judge call
per judge of a panel per vote, for every `agent` assertion of a turn played and of the
conversation's end (those nested in `not`/`any`/`all` included); each case times its
repeats. Where turns are dynamic (a simulator or a person answers the agent) the case
counts as many turns as it may play (its max_turns), and the simulator a call for each
turn after the static ones: the counts are then upper bounds, said as "up to". What is
not counted: a turn's extra rounds of mocked tool calls, retries, and the reply cache,
which serves a stable judge's reply again for nothing; generators are called by the dry
run itself, to produce its cases, and show what they used.

Tokens are not known before a run: the estimate assumes `PROMPT_TOKENS` and
`COMPLETION_TOKENS` a call (docs/DESIGN.md, "The dry run's cost estimate"), and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agenttest_worker.agents import ProjectConfig, parse_ref
from agenttest_worker.assertions import AgentAssertion, AssertionSpec
from agenttest_worker.cases import Case
from agenttest_worker.engine import tokens_cost
from agenttest_worker.results import RoleUsage, UsageRole

# What one call is assumed to use, for the estimate (see the module docstring).
PROMPT_TOKENS = 1_000
COMPLETION_TOKENS = 250
ROLES: tuple[UsageRole, ...] = ("target", "judge", "simulator", "generator", "reporter")
NO_AGENT = "(none)"


@dataclass
class CallCount:
    calls: int = 0
    # Some of its calls depend on how the conversation goes: `calls` is an upper bound.
    bound: bool = False


@dataclass
class CallEstimate:
    """Calls by (role, agent), and those already made (the generators')."""

    counts: dict[tuple[UsageRole, str], CallCount] = field(default_factory=dict)
    made: dict[UsageRole, RoleUsage] = field(default_factory=dict)

    def add(self, role: UsageRole, agent: str | None, calls: int, bound: bool = False) -> None:
        if calls <= 0:
            return
        found = self.counts.setdefault((role, agent or NO_AGENT), CallCount())
        found.calls += calls
        found.bound = found.bound or bound


def _agent_name(use: str | None, default: str | None) -> str | None:
    ref = use if use is not None else default
    return None if ref is None else parse_ref(ref, default_kind="agents").id


def _judge_calls(
    assertions: Iterable[AssertionSpec], config: ProjectConfig
) -> Iterable[tuple[str | None, int]]:
    """(judge, calls) of every agent assertion among `assertions`, nested ones included."""
    for assertion in assertions:
        if isinstance(assertion, AgentAssertion):
            votes = assertion.votes or config.defaults.judge_votes
            panel = assertion.use if isinstance(assertion.use, list) else [assertion.use]
            for judge in panel:
                yield _agent_name(judge, config.defaults.judge), votes
        yield from _judge_calls((part for _, part in assertion.parts()), config)


def count_case(
    estimate: CallEstimate,
    case: Case,
    config: ProjectConfig,
    target: str | None,
    *,
    repeat: int | None = None,
    interactive: bool = False,
) -> None:
    """Add the calls of `case`, played `repeat` (None: its own `repeat`) times."""
    times = repeat or case.repeat or 1
    limit = case.limit_turns()
    static = min(len(case.turns), limit)
    person = interactive or bool(case.interactive and case.interactive.enabled)
    dynamic = case.simulator is not None or person
    turns = limit if dynamic else static
    estimate.add("target", case.agent or target, turns * times, bound=dynamic)
    if case.simulator is not None:
        simulator = _agent_name(case.simulator.use, config.defaults.simulator)
        estimate.add("simulator", simulator, (limit - static) * times, bound=True)
    played = [a for turn in case.turns[:static] for a in turn.assertions]
    for judge, calls in _judge_calls([*played, *case.final_assertions], config):
        estimate.add("judge", judge, calls * times)


def _cost(config: ProjectConfig, agent: str, calls: int) -> float | None:
    entry = config.agents.get(agent)
    if entry is None or entry.pricing is None:
        return None
    return calls * tokens_cost(config, agent, PROMPT_TOKENS, COMPLETION_TOKENS)


def estimate_lines(estimate: CallEstimate, config: ProjectConfig) -> list[str]:
    """The dry run's account of the calls and their cost, for stderr."""
    lines = [
        "Calls the run will make (cases × turns × judges × votes × repeats; "
        '"up to" where a simulator or a person plays up to max_turns):'
    ]
    total, bounded = 0.0, False
    unpriced: list[str] = []
    ordered = sorted(estimate.counts.items(), key=lambda kv: (ROLES.index(kv[0][0]), kv[0][1]))
    for (role, agent), count in ordered:
        calls = f"up to {count.calls:,}" if count.bound else f"{count.calls:,}"
        found = _cost(config, agent, count.calls)
        if agent == NO_AGENT:
            priced = "no agent named"
        elif found is None:
            unpriced.append(agent)
            priced = f"no pricing set for {agent}"
        else:
            total += found
            bounded = bounded or count.bound
            priced = f"~${found:,.4f}"
        lines.append(f"  {role:<10} {agent:<20} {calls:>14} {_calls(count.calls)}  {priced}")
    for role, used in _made(estimate.made):
        spent = f"${used.cost:,.4f}" if used.cost else "nothing priced"
        made = f"{used.calls:>14,} {_calls(used.calls)}"
        lines.append(f"  {role:<10} {'(called)':<20} {made}  {spent}, made")
        total += used.cost
    if not estimate.counts and not estimate.made:
        return [*lines, "  none"]
    if total or any(_cost(config, agent, 1) is not None for _, agent in estimate.counts):
        assumed = (
            f"assuming {PROMPT_TOKENS:,} prompt and {COMPLETION_TOKENS:,} completion tokens "
            "a call, before the reply cache"
        )
        lines.append(f"Estimated cost: {'up to ' if bounded else ''}~${total:,.4f} ({assumed})")
    else:
        lines.append("Estimated cost: none (no agent it calls has pricing set)")
    if unpriced:
        lines.append(f"No pricing set for {', '.join(sorted(set(unpriced)))}: not estimated")
    return lines


def _calls(count: int) -> str:
    return "call " if count == 1 else "calls"


def _made(made: Mapping[UsageRole, RoleUsage]) -> list[tuple[UsageRole, RoleUsage]]:
    return [(role, made[role]) for role in ROLES if role in made]
