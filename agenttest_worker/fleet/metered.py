"""The worker's store, counting each step it records into the metrics (observe/metrics.py).

Counted when a step is saved, not when it is played: a duplicate or redelivered
message whose turn was already recorded saves nothing and counts nothing, so a worker's
turns, calls, tokens and cost add up to what its runs stored. A copy that played the
step at the same time as the one that saved it made its calls all the same, which its
run counts (`runs.usage`): those count as calls, tokens and cost, not as turns.

What a step needs beyond the step itself (the case's target agent, the run's pricing)
comes from the load of the same conversation that preceded it (every turn reads its
conversation before it plays; on the loop pool the load and the save may run on
different store threads: they are matched by run and case, not by thread), kept until
its save.

With metrics off, `metered` makes a plain SqlStore: nothing on the hot path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.driver.run_cache import pricing_config
from agenttest_worker.engine.outcome import call_cost
from agenttest_worker.observe import metrics
from agenttest_worker.results import AgentCallRecord
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.steps import LoadedCase, Saved, Step


class _Seen(NamedTuple):
    """What a save needs of the load before it: not the load itself, whose case and
    state texts a turn in flight would otherwise hold here while it waits."""

    agent: str | None
    pricing: ProjectConfig | None


class MeteredStore(SqlStore):
    """A SqlStore whose saved steps are counted."""

    # Loads kept for the saves that follow them, with how many saves are still to come
    # (two copies of one turn, each loading before either saves): a load with no save
    # after it (a duplicate message) stays until this many newer loads have pushed it out.
    KEPT_LOADS = 65536

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._lock = threading.Lock()
        self._loaded: OrderedDict[tuple[str, str], tuple[_Seen, int]] = OrderedDict()

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> LoadedCase | None:
        loaded = super().load_case(run_id, case_id, count_delivery, turn)
        if loaded is not None:
            key = (run_id, case_id)
            seen = _Seen(loaded.agent, pricing_config(loaded))
            with self._lock:
                _, waiting = self._loaded.get(key, (None, 0))
                self._loaded[key] = (seen, waiting + 1)
                self._loaded.move_to_end(key)
                if len(self._loaded) > self.KEPT_LOADS:
                    self._loaded.popitem(last=False)
        return loaded

    def save_step(self, step: Step) -> Saved:
        saved = super().save_step(step)
        key = (step.run_id, step.case_id)
        with self._lock:
            seen, waiting = self._loaded.pop(key, (None, 0))
            if seen is not None and waiting > 1:
                self._loaded[key] = (seen, waiting - 1)
        if saved.saved:
            self._count(step, seen)
        else:
            metrics.unrecorded_calls(step.new_turns, self._pricing(seen))
        return saved

    @staticmethod
    def _pricing(seen: _Seen | None) -> Callable[[AgentCallRecord], float]:
        config = seen.pricing if seen is not None else None

        def cost(call: AgentCallRecord) -> float:
            return call_cost(call, config)

        return cost

    def _count(self, step: Step, seen: _Seen | None) -> None:
        cost = self._pricing(seen)
        agent = step.result.agent if step.result is not None else None
        if agent is None and seen is not None:
            agent = seen.agent
        ended = step.result.status if step.result is not None else None
        metrics.recorded_step(agent, step.new_turns, ended, cost)


def metered(url: str) -> SqlStore:
    """The store of `url`, counting its saved steps when this process's metrics are on."""
    return MeteredStore(url) if metrics.enabled() else SqlStore(url)
