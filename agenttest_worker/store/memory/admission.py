"""A fresh embedded run's cases, taken from the submitter's spool as its lanes start
them: a run of a million cases holds only those under way (BufferedStore.admit).

The cases come in submission order, so how many were taken is the submission position
of the next one: the cases never taken are those from there on (a --deadline ends them
in one statement). A repeated case's first repetitions, written one after the other,
can be taken ahead of their turn and held, so that the decision to add another
repetition (--repeat auto) sees all of them, as a fleet's store does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from agenttest_worker.store.steps import CaseRecord


class Admission:
    def __init__(self, records: Iterator[CaseRecord], admitted: int = 0) -> None:
        self._records = records
        self.admitted = admitted
        # A case read to look at it (take_ahead) and not yet taken.
        self._peeked: CaseRecord | None = None
        # Cases taken ahead of their turn, to be handed out before any other.
        self._ahead: deque[str] = deque()

    def ahead(self) -> str | None:
        """The next case taken ahead of its turn, if any."""
        return self._ahead.popleft() if self._ahead else None

    def take(self) -> CaseRecord | None:
        """The next case, or None once every case was taken."""
        taken: CaseRecord | None
        if self._peeked is not None:
            taken, self._peeked = self._peeked, None
        else:
            taken = next(self._records, None)
        if taken is not None:
            self.admitted += 1
        return taken

    def take_ahead(self, test_id: str) -> list[CaseRecord]:
        """The next cases while they are repetitions of case `test_id`, taken now (the
        caller holds them) and handed out by `ahead` before any other."""
        taken: list[CaseRecord] = []
        while True:
            if self._peeked is None:
                self._peeked = next(self._records, None)
            if self._peeked is None:
                return taken
            record = self._peeked[2]
            if "repetition" not in record or record.get("id") != test_id:
                return taken
            found = self.take()
            assert found is not None
            taken.append(found)
            self._ahead.append(found[0])

    def close(self) -> int:
        """Take no more cases; how many were taken."""
        self._records, self._peeked = iter(()), None
        return self.admitted
