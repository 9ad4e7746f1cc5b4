"""A worker's Prometheus metrics, and the calls that count into them.

Off unless AGENTTEST_METRICS_PORT is set: a worker then turns them on at start-up
(`enable`, from fleet/metrics_server.py, which also serves them). Until then every function
here returns after reading one module global, and prometheus_client is never imported:
the embedded runner and the submitter pay nothing.

Labels stay bounded whatever a fleet runs: an agent's name (an agenttest.yaml entry),
a role, and small fixed sets of statuses, outcomes and reasons. Never a run, case or
session id: each run would add series that live on in Prometheus long after it ended
(`agenttest-submit metrics`, one process for the fleet, labels by run instead, and only
runs still going). No label or value ever holds a URL, a message or a secret.

Turns, conversations, calls, latency, tokens and cost are counted from the steps a
worker recorded (fleet/metered.py), once per turn however often its message was
delivered, so that they add up to what the run stored. Retries, rate-limit waits and
breaker refusals are counted where they happen (agents/http/transport.py, ratelimit.py,
breaker.py), as are 429s and the limits learned from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agenttest_worker.results import AgentCallRecord, TurnResult

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# Agent calls last from milliseconds (a cached reply) to minutes (a long generation).
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
# A turn spans its target's calls, tool rounds, the judges and the simulator.
TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
# Most slots are free at once (a few milliseconds of Redis); a 429's pause lasts seconds.
WAIT_BUCKETS = (0.005, 0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120, 300)

# What the call records say a role is, as usage_by_role names it (a validator is the judge).
_ROLE_NAMES = {"validator": "judge"}


class WorkerMetrics:
    """Every metric a worker process exports (README "Metrics" lists them)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        agent_role = ["agent", "role"]
        self.turns = Counter(
            "agenttest_turns",
            "Turns recorded, by the case's target agent and the turn's status",
            ["agent", "status"],
            registry=registry,
        )
        self.turn_seconds = Histogram(
            "agenttest_turn_seconds",
            "Duration of the turns recorded, by target agent",
            ["agent"],
            buckets=TURN_BUCKETS,
            registry=registry,
        )
        self.conversations_finished = Counter(
            "agenttest_conversations_finished",
            "Conversations ended, by target agent and the case's status",
            ["agent", "status"],
            registry=registry,
        )
        # Each conversation plays one turn at a time: turns being played are conversations
        # in flight on this worker. livesum: the processes of a prefork worker add up.
        self.in_flight = Gauge(
            "agenttest_conversations_in_flight",
            "Conversations playing a turn in this worker now",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.calls = Counter(
            "agenttest_agent_calls",
            "Agent calls recorded, by agent, role and outcome "
            "(ok, 429, 5xx, 4xx, timeout, connection, error)",
            [*agent_role, "outcome"],
            registry=registry,
        )
        self.retries = Counter(
            "agenttest_agent_retries",
            "Agent call attempts retried, by agent, role and reason "
            "(429, 5xx, 4xx, timeout, connection, stream)",
            [*agent_role, "reason"],
            registry=registry,
        )
        self.call_seconds = Histogram(
            "agenttest_agent_call_seconds",
            "Agent call latency, retries and back-offs included, by agent and role",
            agent_role,
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.first_token_seconds = Histogram(
            "agenttest_agent_first_token_seconds",
            "Time from a streamed call's start to its first piece of content",
            agent_role,
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "agenttest_agent_tokens",
            "Tokens the agents reported, by agent, role and kind (prompt, completion)",
            [*agent_role, "kind"],
            registry=registry,
        )
        self.cost = Counter(
            "agenttest_agent_cost",
            "Cost of the agent calls under each agent's pricing in agenttest.yaml",
            agent_role,
            registry=registry,
        )
        self.rate_limit_wait = Histogram(
            "agenttest_rate_limit_wait_seconds",
            "Time an attempt waited for a slot of its agent's rate limits",
            ["agent"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.rate_limited = Counter(
            "agenttest_agent_429",
            "Replies 429 (too many requests) from the agent, retried or not",
            ["agent"],
            registry=registry,
        )
        # livemin: on a fleet every process reads the same learned limit from Redis; the
        # lowest is the one a process has acted on since its last 429.
        self.learned_concurrency = Gauge(
            "agenttest_agent_learned_concurrency",
            "Calls in flight to an agent with no rate_limit that its 429s allow (0: none learned)",
            ["agent"],
            registry=registry,
            multiprocess_mode="livemin",
        )
        # livemax: open in any process of the worker is open for the worker.
        self.breaker_open = Gauge(
            "agenttest_agent_breaker_open",
            "1 while this worker last found the agent's circuit breaker open, else 0",
            ["agent"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.breaker_rejected = Counter(
            "agenttest_agent_breaker_rejected",
            "Agent calls failed at once because the agent's circuit breaker was open",
            ["agent"],
            registry=registry,
        )
        self.redeliveries = Counter(
            "agenttest_redeliveries",
            "Turn messages the broker delivered again to this worker (their worker died)",
            registry=registry,
        )
        self.sweeper = Counter(
            "agenttest_sweeper_recovered",
            "What this worker's sweeper recovered, by kind (turn: a conversation's next "
            "turn enqueued again; start: conversations started; aggregation: a run's "
            "reports built)",
            ["kind"],
            registry=registry,
        )


_on: WorkerMetrics | None = None


def enable(registry: CollectorRegistry | None = None) -> WorkerMetrics:
    """Turn the metrics on in this process (once; later calls return the same)."""
    global _on
    if _on is None:
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        _on = WorkerMetrics(registry)
    return _on


def enabled() -> bool:
    return _on is not None


def role_name(role: str) -> str:
    return _ROLE_NAMES.get(role, role)


def call_outcome(call: AgentCallRecord) -> str:
    """How a recorded call ended, in one of a few words (the `outcome` label)."""
    if call.error is None:
        return "ok"
    status = call.status_code
    if status == 429:
        return "429"
    if status is not None and status >= 500:
        return "5xx"
    if status is not None and status >= 400:
        return "4xx"
    # No HTTP error: the transport's words say which (agents/http/transport.py, breaker.py).
    text = call.error
    if text.startswith("timeout"):
        return "timeout"
    if "cannot reach" in text or "unreachable since" in text or "stream broke off" in text:
        return "connection"
    return "error"  # a reply that could not be used, a script that raised


def retry_reason(kind: str, status: int | None) -> str:
    """Why an attempt is retried (the `reason` label), from its AgentError kind."""
    if kind == "http" and status is not None:
        if status == 429:
            return "429"
        return "5xx" if status >= 500 else "4xx"
    return kind if kind in ("timeout", "stream") else "connection"


def recorded_step(
    agent: str | None,
    turns: Iterable[TurnResult],
    ended: str | None,
    cost: Callable[[AgentCallRecord], float] | None = None,
) -> None:
    """A step a worker saved: its turns (with their calls), and the case's status when
    the step ended it. `cost(call)` prices a call (0 without a price)."""
    on = _on
    if on is None:
        return
    target = agent or "none"
    for turn in turns:
        on.turns.labels(target, turn.status).inc()
        on.turn_seconds.labels(target).observe(turn.duration_ms / 1000)
        for call in turn.calls or ():
            _count_call(on, call, cost)
    if ended is not None:
        on.conversations_finished.labels(target, ended).inc()


def unrecorded_calls(
    turns: Iterable[TurnResult], cost: Callable[[AgentCallRecord], float] | None = None
) -> None:
    """The calls of a step a worker played but did not save (a copy of its message saved
    it first, or its conversation ended meanwhile): counted as calls, tokens and cost,
    which the run counts too (store/sql/usage.py), but not as turns."""
    on = _on
    if on is None:
        return
    for turn in turns:
        for call in turn.calls or ():
            _count_call(on, call, cost)


def _count_call(
    on: WorkerMetrics, call: AgentCallRecord, cost: Callable[[AgentCallRecord], float] | None
) -> None:
    role = role_name(call.role)
    on.calls.labels(call.agent, role, call_outcome(call)).inc()
    on.call_seconds.labels(call.agent, role).observe(call.latency_ms / 1000)
    if call.first_token_ms is not None:  # a streamed reply; one read whole has none
        on.first_token_seconds.labels(call.agent, role).observe(call.first_token_ms / 1000)
    if call.usage is not None:
        on.tokens.labels(call.agent, role, "prompt").inc(call.usage.prompt_tokens)
        on.tokens.labels(call.agent, role, "completion").inc(call.usage.completion_tokens)
    priced = cost(call) if cost is not None else 0.0
    if priced:
        on.cost.labels(call.agent, role).inc(priced)


def retried(agent: str, role: str, kind: str, status: int | None) -> None:
    """An attempt failed and its call tries again (agents/http/transport.py)."""
    on = _on
    if on is not None:
        on.retries.labels(agent, role_name(role), retry_reason(kind, status)).inc()


def rate_limit_waited(agent: str, seconds: float) -> None:
    """An attempt got its rate-limit slot after `seconds` (agents/limits/ratelimit.py)."""
    on = _on
    if on is not None:
        on.rate_limit_wait.labels(agent).observe(seconds)


def answered_429(agent: str) -> None:
    """The agent answered 429 (agents/http/transport.py)."""
    on = _on
    if on is not None:
        on.rate_limited.labels(agent).inc()


def learned_concurrency(agent: str, limit: int) -> None:
    """The agent's learned limit of calls in flight is now `limit` (agents/limits/ratelimit.py)."""
    on = _on
    if on is not None:
        on.learned_concurrency.labels(agent).set(limit)


def breaker_seen(key: str, open_: bool) -> None:
    """What a call found of an agent's breaker (agents/limits/breaker.py); `key` is
    "agent@host:port", and only the agent's name becomes a label."""
    on = _on
    if on is None:
        return
    agent = key.rsplit("@", 1)[0]
    on.breaker_open.labels(agent).set(1 if open_ else 0)
    if open_:
        on.breaker_rejected.labels(agent).inc()


def redelivered() -> None:
    on = _on
    if on is not None:
        on.redeliveries.inc()


def recovered(kind: str, count: int = 1) -> None:
    """The sweeper recovered `count` of `kind` (turn, start, aggregation)."""
    on = _on
    if on is not None and count:
        on.sweeper.labels(kind).inc(count)


def playing() -> Playing:
    """A turn being played in this process (conversations in flight), while inside."""
    return Playing()


class Playing:
    """`playing`. A class, not a generator: a fleet's turn holds it for as long as it
    runs, thousands at once against a slow agent, and a generator's context manager
    with its frame was ~600 bytes of each."""

    __slots__ = ("_on",)

    def __init__(self) -> None:
        self._on: WorkerMetrics | None = None

    def __enter__(self) -> None:
        self._on = on = _on
        if on is not None:
            on.in_flight.inc()

    def __exit__(self, *exc: object) -> None:
        if self._on is not None:
            self._on.in_flight.dec()
            self._on = None
