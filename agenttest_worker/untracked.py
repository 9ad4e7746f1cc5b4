"""Models that do not track which of their fields were set.

Pydantic gives every instance a set of the names of its fields that were set
(`model_fields_set`, what `exclude_unset` reads), and adds to it on each assignment:
216 bytes for a model with up to four fields set, 728 beyond. The records a turn builds
and fills in (its result, calls, usage, the conversation's state) are never dumped with
`exclude_unset` and nothing reads their fields-set, yet on a worker holding thousands of
turns in flight those sets were ~15% of the memory each turn held while it waited on its
agent (benchmarks/in_flight.py). A model deriving from `UntrackedFields` keeps none: its
`model_fields_set` is always empty, so `exclude_unset` would leave everything out —
never use it on one (tests/test_untracked.py checks that no module does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel


class _NoFields(set[str]):
    """The one fields-set all untracked models share: empty, and staying so."""

    def add(self, name: str) -> None:
        pass

    def update(self, *others: Iterable[Any]) -> None:
        pass

    def __copy__(self) -> _NoFields:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _NoFields:
        return self


_NO_FIELDS = _NoFields()


class UntrackedFields(BaseModel):
    # A property in place of BaseModel's slot: pydantic (and pydantic-core, which sets
    # the attribute through the ordinary attribute protocol) writes into it in vain and
    # reads back the shared empty set.
    @property
    def __pydantic_fields_set__(self) -> set[str]:
        return _NO_FIELDS

    @__pydantic_fields_set__.setter
    def __pydantic_fields_set__(self, value: set[str]) -> None:
        pass
