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

A case is the other thing a turn in flight holds: its Case, every Turn and every
assertion, each with a fields-set of its own (~1.6 KB for a two-turn case with one
assertion a turn). Those are dumped with `exclude_unset` (a case's record), so they keep
their fields-sets; but a worker's validated cases are never changed, and the cases of
one suite are of a few shapes. `share_fields_sets` makes the models of one case use one
read-only set per distinct set of names, shared by every case given to it.
"""

from __future__ import annotations

import typing
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


class _ReadOnlyShared:
    """What the read-only models of a case share in place of their own: changing it
    would change them all, so its methods that change it refuse (each class names
    them); a copy (`model_copy(deep=True)`, `copy.copy`, a pickle) is a plain `_base` of
    the copy's own."""

    _base: type[Any]
    _what: str

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise TypeError(f"a shared {self._what}: copy the model (model_copy) before changing it")

    def __copy__(self) -> Any:
        return self._base(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self._base(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (self._base, (self._base(self),))


class _SharedFields(_ReadOnlyShared, set[str]):
    """A fields-set shared by the read-only models of one shape (pydantic changes a
    fields-set with `add` and `update`)."""

    _base, _what = set, "fields-set"
    add = update = discard = remove = pop = clear = _ReadOnlyShared._refuse


class _SharedEmptyList(_ReadOnlyShared, list[Any]):
    """The one empty list the read-only models share in place of each of theirs (a
    case's `tags`, `attachments`, `final_assertions`...: seven in a short case, 72 bytes
    each, held by every turn in flight)."""

    _base, _what = list, "empty list"
    append = extend = insert = remove = pop = clear = sort = reverse = _ReadOnlyShared._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _ReadOnlyShared._refuse


class _SharedEmptyDict(_ReadOnlyShared, dict[Any, Any]):
    """The one empty dict the read-only models share (a case's `tool_mocks`...)."""

    _base, _what = dict, "empty dict"
    update = setdefault = pop = popitem = clear = _ReadOnlyShared._refuse
    __setitem__ = __delitem__ = __ior__ = _ReadOnlyShared._refuse


_EMPTY_LIST = _SharedEmptyList()
_EMPTY_DICT = _SharedEmptyDict()


# One shared set per distinct set of names. Bounded: past it, models keep their own (a
# suite with thousands of shapes gains nothing from sharing anyway).
_SHARED: dict[frozenset[str], _SharedFields] = {}
_SHARED_MOST = 4096


def share_fields_sets(model: BaseModel) -> None:
    """Give `model` and every model it holds (in fields typed to hold models: directly,
    in lists, tuples, dict values and unions) the shared fields-set of its shape, and
    one shared empty list and dict for each of their fields that holds an empty one.
    Only for models nothing changes afterwards: assigning a field of one, or adding to
    a shared empty list or dict, then raises TypeError (what they share stays as it
    was)."""
    pending: list[Any] = [model]
    while pending:
        found = pending.pop()
        held = found.__pydantic_fields_set__
        # (Exactly a set: a shared one, or an untracked model's, is a subclass.)
        if type(held) is set:
            key = frozenset(held)
            shared = _SHARED.get(key)
            if shared is None and len(_SHARED) < _SHARED_MOST:
                # setdefault: two threads sharing the same new shape end with one set.
                shared = _SHARED.setdefault(key, _SharedFields(key))
            if shared is not None:
                object.__setattr__(found, "__pydantic_fields_set__", shared)
        values = found.__dict__
        for name, value in values.items():
            if not value and type(value) is list:
                values[name] = _EMPTY_LIST
            elif not value and type(value) is dict:
                values[name] = _EMPTY_DICT
        for name in _model_fields(type(found)):
            value = values.get(name)
            if value is None:
                continue
            if isinstance(value, list | tuple):
                for item in value:
                    if isinstance(item, BaseModel):
                        pending.append(item)
            elif isinstance(value, BaseModel):
                pending.append(value)
            elif isinstance(value, dict):
                for item in value.values():
                    if isinstance(item, BaseModel):
                        pending.append(item)


_WALKED: dict[type[BaseModel], tuple[str, ...]] = {}


def _model_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `cls` whose type can hold a model: the only ones worth walking
    (walking every field cost more than validating the case)."""
    found = _WALKED.get(cls)
    if found is None:
        found = _WALKED[cls] = tuple(
            name for name, field in cls.model_fields.items() if _holds_models(field.annotation)
        )
    return found


def _holds_models(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_models(arg) for arg in typing.get_args(annotation))
