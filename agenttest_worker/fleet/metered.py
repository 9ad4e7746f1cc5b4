"""The worker's store, counting each step it records into the metrics (observe/metrics.py).

Counted when a step is saved, not when it is played: a duplicate or redelivered
message whose turn was already recorded saves nothing and counts nothing, so a worker's
turns, calls, tokens and cost add up to what its runs stored. What a step needs beyond
the step itself (the case's target agent, the run's pricing) comes from the load that
preceded it in the same thread: a turn task loads and saves its conversation in the
thread that runs it (driver/step.py).

With metrics off, `metered` makes a plain SqlStore: nothing on the hot path.
"""

from __future__ import annotations

import threading

from agenttest_worker.driver.run_cache import pricing_config
from agenttest_worker.engine.outcome import call_cost
from agenttest_worker.observe import metrics
from agenttest_worker.results import AgentCallRecord
from agenttest_worker.store.base import SqlStore
from agenttest_worker.store.steps import LoadedCase, Saved, Step


class MeteredStore(SqlStore):
    """A SqlStore whose saved steps are counted."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._loaded = threading.local()

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> LoadedCase | None:
        loaded = super().load_case(run_id, case_id, count_delivery, turn)
        self._loaded.case = loaded
        return loaded

    def save_step(self, step: Step) -> Saved:
        saved = super().save_step(step)
        if saved.saved:
            self._count(step)
        return saved

    def _count(self, step: Step) -> None:
        loaded: LoadedCase | None = getattr(self._loaded, "case", None)
        if loaded is not None and (loaded.run_id, loaded.case_id) != (step.run_id, step.case_id):
            loaded = None
        config = pricing_config(loaded) if loaded is not None else None

        def cost(call: AgentCallRecord) -> float:
            return call_cost(call, config)

        agent = step.result.agent if step.result is not None else None
        if agent is None and loaded is not None:
            agent = loaded.agent
        ended = step.result.status if step.result is not None else None
        metrics.recorded_step(agent, step.new_turns, ended, cost)


def metered(url: str) -> SqlStore:
    """The store of `url`, counting its saved steps when this process's metrics are on."""
    return MeteredStore(url) if metrics.enabled() else SqlStore(url)
