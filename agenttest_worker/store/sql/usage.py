"""What a run's agent calls used: grouped from `agent_calls` by role and agent (what
`status RUN` shows while the run goes on), and what the run used outside its
conversations' records (`runs.usage`: generator agents at submission, a --reporter
agent, and the calls of turns played but not recorded: a copy of a turn's message
that lost the race to record it, or a turn whose conversation was ended meanwhile)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast, get_args

from sqlalchemy import Connection, func, select, update

from agenttest_worker.results import RoleUsage, UsageRole, add_usage, usage_spend
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import AgentCallRow
from agenttest_worker.store.sql.shared import RUNS

_ROLES = frozenset(get_args(UsageRole))


@dataclass(frozen=True)
class AgentCalls:
    """The calls one agent made in one role, as `agent_calls` holds them (`role` as the
    call was recorded: a judge's is `validator`)."""

    role: str
    agent: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def calls_by_agent(url: str, run_id: str) -> list[AgentCalls]:
    """Every (role, agent) of the run's recorded calls, finished conversations or not."""
    with session_scope(url) as session:
        rows = session.execute(
            select(
                AgentCallRow.role,
                AgentCallRow.agent,
                func.count(),
                func.coalesce(func.sum(AgentCallRow.prompt_tokens), 0),
                func.coalesce(func.sum(AgentCallRow.completion_tokens), 0),
                func.coalesce(func.sum(AgentCallRow.total_tokens), 0),
            )
            .where(AgentCallRow.run_id == run_id)
            .group_by(AgentCallRow.role, AgentCallRow.agent)
            .order_by(AgentCallRow.role, AgentCallRow.agent)
        ).all()
    return [AgentCalls(r, a, int(n), int(p), int(c), int(t)) for r, a, n, p, c, t in rows]


def stored_usage(value: Mapping[str, Any] | None) -> dict[UsageRole, RoleUsage]:
    """`runs.usage` as read: by role (a role this version does not know is left out)."""
    return {
        cast(UsageRole, role): RoleUsage.model_validate(found)
        for role, found in (value or {}).items()
        if role in _ROLES and isinstance(found, Mapping)
    }


# The key of `runs.usage` beside the roles: how many of the calls it counts were made by
# turns whose records the store does not hold (played but not recorded: a copy of the
# turn recorded it first, its conversation ended meanwhile, or the store refused the
# step), so that the run's calls add up although `agent_calls` lacks their rows.
CALLS_UNSAVED = "calls_unsaved"


def calls_unsaved(value: Mapping[str, Any] | None) -> int:
    """`runs.usage`'s count of calls whose turns are not recorded (CALLS_UNSAVED)."""
    found = (value or {}).get(CALLS_UNSAVED)
    return found if isinstance(found, int) else 0


def usage_document(usage: Mapping[UsageRole, RoleUsage]) -> dict[str, Any] | None:
    """What `runs.usage` holds for `usage` (None for no calls)."""
    return {role: found.model_dump(mode="json") for role, found in usage.items()} or None


def add_run_usage(
    url: str,
    run_id: str,
    usage: Mapping[UsageRole, RoleUsage],
    *,
    spent: bool = False,
    unsaved: bool = False,
) -> None:
    """Add `usage` to what the run used outside its conversations' records; `spent`:
    to the run's totals (`total_tokens`, `total_cost`, what its budget counts) as well;
    `unsaved`: its calls were made by turns whose records are not stored (CALLS_UNSAVED)."""
    if not usage:
        return
    with session_scope(url) as session:
        add_run_usage_on(session.connection(), run_id, usage, spent=spent, unsaved=unsaved)


def add_run_usage_on(
    connection: Connection,
    run_id: str,
    usage: Mapping[UsageRole, RoleUsage],
    *,
    spent: bool = False,
    unsaved: bool = False,
) -> None:
    """`add_run_usage` in `connection`'s transaction."""
    if not usage:
        return
    # Locked while read and written (Postgres), so two adders cannot lose one's calls.
    stored = connection.execute(
        select(RUNS.c.usage).where(RUNS.c.id == run_id).with_for_update()
    ).scalar_one_or_none()
    document = usage_document(add_usage(stored_usage(stored), usage)) or {}
    not_recorded = calls_unsaved(stored) + (sum(u.calls for u in usage.values()) if unsaved else 0)
    if not_recorded:
        document[CALLS_UNSAVED] = not_recorded
    values: dict[str, Any] = {"usage": document or None}
    if spent:
        tokens, cost = usage_spend(usage)
        values |= {
            "total_tokens": RUNS.c.total_tokens + tokens,
            "total_cost": RUNS.c.total_cost + cost,
        }
    connection.execute(update(RUNS).where(RUNS.c.id == run_id).values(**values))


# The roles only ever called outside a conversation: generators at submission, a
# --reporter after the run. `runs.total_cost` counts the conversations' calls (what a
# budget is spent by); these are in `runs.usage` alone.
_OUTSIDE_CONVERSATIONS: tuple[UsageRole, ...] = ("generator", "reporter")


def run_cost(total_cost: float | None, usage: Mapping[str, Any] | None) -> float:
    """A run's whole cost: its conversations' (`runs.total_cost`, turns played but not
    recorded included) and its generators' and reporter's (`runs.usage`)."""
    outside = stored_usage(usage)
    more = sum(outside[role].cost for role in _OUTSIDE_CONVERSATIONS if role in outside)
    return round((total_cost or 0.0) + more, 9)
