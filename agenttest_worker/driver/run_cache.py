"""What a process keeps of the runs it plays, so that a turn does not build it again:
agent pools and configs by run, validated cases and run options.

A run's cases, options and agenttest.yaml never change once stored; validating them
again on every turn was a measurable share of a turn's CPU.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.config_loading import config_from_stored
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.agents.reply_cache import CachePolicy, ReplyCacheStore
from agenttest_worker.cases.case_model import Case
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import ConfigError
from agenttest_worker.observe.received_spans import SpanReader
from agenttest_worker.store import steps

M = TypeVar("M", bound=BaseModel)


class PoolCache:
    """Agent pools by run, so that a worker serving many runs reuses clients.

    `replies` makes the reply cache the pools share (made on first use; None: no cache),
    used as each run's options say; `spans` makes where trace assertions read the spans
    agents sent (observe/received_spans.py; None: nowhere)."""

    def __init__(
        self,
        size: int = 32,
        replies: Callable[[], ReplyCacheStore] | None = None,
        spans: Callable[[], SpanReader] | None = None,
    ) -> None:
        self.size = size
        self._pools: OrderedDict[str, AgentPool] = OrderedDict()
        self._make_replies = replies
        self._replies: ReplyCacheStore | None = None
        self._make_spans = spans
        self._spans: SpanReader | None = None

    def spans(self) -> SpanReader | None:
        if self._spans is None and self._make_spans is not None:
            self._spans = self._make_spans()
        return self._spans

    def for_run(
        self, run_id: str, config: dict[str, Any], options: RunOptions | None = None
    ) -> AgentPool:
        pool = self._pools.get(run_id)
        if pool is None:
            replies: ReplyCacheStore | None = None
            if self._make_replies is not None:
                if self._replies is None:
                    self._replies = self._make_replies()
                replies = self._replies
            policy = CachePolicy(options.cache, options.cache_target) if options else None
            pool = AgentPool(config_from_stored(config), replies, policy)
            self._pools[run_id] = pool
            while len(self._pools) > self.size:
                self._pools.popitem(last=False)
        else:
            self._pools.move_to_end(run_id)
        return pool


_configs: OrderedDict[str, ProjectConfig] = OrderedDict()


def run_config(run_id: str, stored: dict[str, Any]) -> ProjectConfig:
    config = _configs.get(run_id)
    if config is None:
        config = _configs[run_id] = config_from_stored(stored)
        while len(_configs) > 32:
            _configs.popitem(last=False)
    return config


def pricing_config(loaded: steps.LoadedCase) -> ProjectConfig | None:
    """The run's config, to price the calls of a case's record; None when this process
    cannot read it (a ${VAR} it lacks): the conversation then ended failed without
    calling anyone (driver/step.py `_pool_or_failure`), so there is nothing to price."""
    try:
        return run_config(loaded.run_id, loaded.run_config)
    except ConfigError:
        return None


class _Memo:
    """A small LRU of validated models."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[str, str], make: Any) -> Any:
        with self.lock:
            found = self.items.get(key)
            if found is not None:
                self.items.move_to_end(key)
                return found
        value = make()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


_cases_memo = _Memo(4096)
_options_memo = _Memo(64)


def case_of(loaded: steps.LoadedCase) -> Case:
    made: Case = _cases_memo.get(
        (loaded.run_id, loaded.case_id), lambda: validated(Case, loaded.case)
    )
    return made


def validated(model: type[M], document: steps.JsonDocument) -> M:
    """`model` from a stored document: from its text if the store handed over text."""
    if isinstance(document, str):
        return model.model_validate_json(document)
    return model.model_validate(document)


def options_of(loaded: steps.LoadedCase) -> RunOptions:
    made: RunOptions = _options_memo.get(
        (loaded.run_id, ""), lambda: RunOptions.model_validate(loaded.run_options)
    )
    return made
