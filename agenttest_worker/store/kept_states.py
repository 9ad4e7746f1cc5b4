"""The conversations whose state this process keeps in memory, by the step that saved it.

A worker that saves a step keeps the state it saved (driver/state_cache.py), keyed by
the random token the step was written with (turns.save_step). The next load of that
conversation tells the database this token: if the row still holds it, nothing wrote
the conversation since, so the state is not sent (LoadedCase.state_kept) and the kept
one is used; any other write (another worker's step, a person's reply, the sweeper)
stamps another token or none, and the state is read as usual.

An entry is taken out whole when it is used (`take`): the step that plays the turn
updates that state in place, and only its saved step puts one back. So a failed or
refused save, a duplicate that loses the guard, or a crash mid-turn leaves nothing
behind to be mistaken for the store's. Bounded (least recently kept go first) and
safe across threads. Nothing here imports SQLAlchemy or the engine: the store asks it
for tokens, the driver keeps and takes the states.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, NamedTuple


class Kept(NamedTuple):
    token: str
    value: Any


class KeptStates:
    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], Kept] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, run_id: str, case_id: str, token: str, value: Any) -> None:
        with self._lock:
            self._items[(run_id, case_id)] = Kept(token, value)
            self._items.move_to_end((run_id, case_id))
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def token(self, run_id: str, case_id: str) -> str | None:
        """The token of the step whose state is kept for this conversation, if any."""
        with self._lock:
            found = self._items.get((run_id, case_id))
        return found.token if found is not None else None

    def take(self, run_id: str, case_id: str, token: str) -> Any | None:
        """The kept value saved with `token`, removed; None (and whatever else was kept
        for the conversation dropped) when there is none."""
        with self._lock:
            found = self._items.pop((run_id, case_id), None)
        return found.value if found is not None and found.token == token else None

    def forget(self, run_id: str, case_id: str) -> None:
        with self._lock:
            self._items.pop((run_id, case_id), None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


# The process's: every SqlStore of the process asks it (a run id is unique across
# databases, being a timestamp and random), and the driver keeps states in it.
KEPT = KeptStates()
