"""context.Options from the spec: what a case, a turn or an assertion passes to an agent."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Skip(BaseModel):
    """What the agent should skip for test traffic (history, trace, ...)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    history: bool | None = None
    trace: bool | None = None


class Options(BaseModel):
    """The spec's context.Options. Unknown keys are errors so that typos surface."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connector: str | None = None
    skip: Skip | None = None
    search: Any = None
    mode: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Model parameters for the agent these options go to (a case's or a turn's for its
    # target, a simulator's for itself), over the agent entry's `params`.
    params: dict[str, Any] = Field(default_factory=dict)

    def for_agent(self) -> dict[str, Any]:
        """What is sent to the agent as `options`, beside `metadata`: skip, search and
        mode, those that are set (as the spec's Go struct's `omitempty`). `connector`
        stays with agenttest, which it tells which registry entry to call; metadata
        travels as `metadata`."""
        sent: dict[str, Any] = {}
        if self.skip is not None:
            sent["skip"] = self.skip.model_dump(mode="json", exclude_none=True)
        if self.search is not None:
            sent["search"] = self.search
        if self.mode is not None:
            sent["mode"] = self.mode
        return sent


_NO_OPTIONS = Options()


def merge_options(*layers: Options | None) -> Options:
    """Merge options outer to inner (case < turn): scalars are replaced, metadata and params
    are merged key by key.

    One layer alone is returned as it is, and none as one shared empty Options (they are
    frozen; callers copy the metadata they change): a turn waiting on its agent then
    holds no Options of its own."""
    given = [layer for layer in layers if layer is not None]
    if len(given) == 1:
        return given[0]
    if not given:
        return _NO_OPTIONS
    connector: str | None = None
    skip: Skip | None = None
    search: Any = None
    mode: str | None = None
    metadata: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        connector = layer.connector if layer.connector is not None else connector
        skip = layer.skip if layer.skip is not None else skip
        search = layer.search if layer.search is not None else search
        mode = layer.mode if layer.mode is not None else mode
        metadata = {**metadata, **layer.metadata}
        params = {**params, **layer.params}
    return Options(
        connector=connector, skip=skip, search=search, mode=mode, metadata=metadata, params=params
    )
