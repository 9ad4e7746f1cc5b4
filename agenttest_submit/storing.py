"""A run's cases written a batch at a time by more than one connection, started in order.

Storing a batch of cases is mostly the database's work (parsing the batch, its rows'
five indexes, the foreign key, the commit), during which the submitter only waits. With
two batches in flight on Postgres, a large run is stored about as fast as the server
can take it on two cores, while the submitter reads the next batch from its spool.
Each batch is handed to the `RunStarter` in input order, once it and every batch
before it are stored, as when they were written one after the other. SQLite takes one
writer at a time: one batch in flight there.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

# Batches being stored at once on Postgres (each on its own connection), and how many
# more wait read: enough to keep a two-core server busy; a batch is a few hundred KB.
POSTGRES_WRITERS = 2
WAITING_PER_WRITER = 2

_DONE = None


class BatchWriter:
    """Stores batches with `store(batch) -> count` on `writers` threads; `stored(first,
    last)` is called for each batch, in order, once it and all before it are stored.

    The first error stops the writing: `put` and `close` raise it. `close` returns
    only once no batch is being written, so that a caller undoing the run (deleting
    it) leaves none written after.
    """

    def __init__(
        self,
        store: Callable[[list[Any]], int],
        stored: Callable[[int, int], None],
        writers: int,
    ) -> None:
        self._store = store
        self._stored = stored
        self._queue: queue.Queue[tuple[int, list[Any]] | None] = queue.Queue(
            writers * WAITING_PER_WRITER
        )
        self._lock = threading.Lock()
        self._finished: dict[int, int] = {}  # first -> last, stored but not yet handed on
        self._next = 0
        self._error: BaseException | None = None
        self._queued = 0
        self._threads = [
            threading.Thread(target=self._write, name=f"agenttest-store-{n}", daemon=True)
            for n in range(writers)
        ]
        for thread in self._threads:
            thread.start()

    def put(self, batch: list[Any]) -> None:
        self._raise()
        first = self._queued
        self._queued += len(batch)
        while True:  # not blocked for good on a full queue when the writers stopped
            try:
                self._queue.put((first, batch), timeout=0.5)
                return
            except queue.Full:
                self._raise()

    def close(self, *, failed: bool = False) -> int:
        """Wait for every batch put (none more if `failed`); the number of cases stored."""
        if failed:
            self._abandon()
        for _ in self._threads:
            self._queue.put(_DONE)
        for thread in self._threads:
            thread.join()
        if not failed:
            self._raise()
        return self._next

    def _write(self) -> None:
        while (item := self._queue.get()) is not _DONE:
            if self._error is not None:
                continue  # stopped: what is left is not written
            first, batch = item
            try:
                count = self._store(batch)
                with self._lock:
                    self._finished[first] = first + count - 1
                    while self._next in self._finished:
                        last = self._finished.pop(self._next)
                        self._stored(self._next, last)
                        self._next = last + 1
            except BaseException as exc:
                with self._lock:
                    self._error = self._error or exc

    def _abandon(self) -> None:
        with self._lock:
            self._error = self._error or RuntimeError("stopped")
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error


def write_batches(
    batches: Iterable[list[Any]],
    store: Callable[[list[Any]], int],
    stored: Callable[[int, int], None],
    writers: int,
) -> int:
    """Store every batch (see BatchWriter); the number of cases stored. On any error,
    here or in a writer, no batch is being written any more when it is raised."""
    writer = BatchWriter(store, stored, writers)
    try:
        for batch in batches:
            writer.put(batch)
    except BaseException:
        writer.close(failed=True)
        raise
    return writer.close()
