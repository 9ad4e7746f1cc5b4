"""Storing a new run: the run row, its cases a batch at a time by more than one
connection, each batch started in order, then its start.

Storing a batch of cases is mostly the database's work (parsing the batch, its rows'
five indexes, the foreign key, the commit), during which the submitter only waits. With
two batches in flight on Postgres, a large run is stored about as fast as the server
can take it on two cores, while the submitter reads the next batch from its spool.
Each batch is handed to the `RunStarter` in input order, once it and every batch
before it are stored, as when they were written one after the other. SQLite takes one
writer at a time: one batch in flight there.

The store (SQLAlchemy) is imported where it is used: a new embedded run's conversations
start while a thread stores it (store/memory/buffered.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from agenttest_worker.settings import get_settings

if TYPE_CHECKING:
    from agenttest_worker.results import RoleUsage, UsageRole
    from agenttest_worker.store import StoredCase

# Batches waiting read for each writer: a batch is a few hundred KB.
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


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


class RunStarter(Protocol):
    """Starts a run's conversations while the rest of its cases are still being stored."""

    def stored(self, run_id: str, first: int, last: int) -> None:
        """Cases `first`..`last` (their positions in the run) are stored."""

    def started(self, run_id: str, every_case_ended: bool) -> None:
        """Every case is stored and the run is running; its conversations may all have
        ended already (then nobody else will enqueue its aggregation)."""


@dataclass(frozen=True, slots=True)
class NewRun:
    """A new run as `write_run` stores it, built once by its submitter."""

    run_id: str
    options: dict[str, Any]
    config: dict[str, Any]
    target: str | None
    label: str
    deadline_at: float | None
    parent_run_id: str | None = None
    suite: str | None = None
    # What its reports' duration counts from: an embedded run's conversations begin
    # before it is stored. Else when its first batch was handed out, else now.
    started_at: datetime | None = None
    # What the generators of its cases called (take_generation_usage): before the run,
    # in no conversation.
    generation_usage: Mapping[UsageRole, RoleUsage] | None = None


def write_run(
    url: str,
    run: NewRun,
    records: Iterable[StoredCase],
    starter: RunStarter | None = None,
) -> int:
    """Bring the store up to date, create the run, add its cases, start it; the number
    of cases stored.

    With a `starter`, each batch of cases is handed to it as soon as it is stored, so
    a fleet works on the first conversations while the rest are written.
    """
    # The store: see the top.
    from agenttest_worker.store import is_sqlite, runs, upgrade, usage_document

    upgrade(url)
    run_id = run.run_id
    usage = run.generation_usage
    runs.create_run(
        url,
        run_id=run_id,
        agent=run.target,
        input_label=run.label,
        options=run.options,
        config=run.config,
        parent_run_id=run.parent_run_id,
        deadline_at=run.deadline_at,
        suite=run.suite,
        usage=usage_document(usage) if usage else None,
    )
    rows = (
        runs.NewCase(seq=i, case_id=case_id, case=record, agent=agent)
        for i, (case_id, agent, record) in enumerate(records)
    )
    first_started: datetime | None = None

    def stored(first: int, last: int) -> None:
        nonlocal first_started
        if starter is not None:
            first_started = first_started or datetime.now(UTC)
            starter.stored(run_id, first, last)

    try:
        total = write_batches(
            _batches(rows, get_settings().enqueue_batch),
            lambda batch: runs.add_cases(url, run_id, batch),
            stored,
            writers=1 if is_sqlite(url) else runs.POSTGRES_WRITERS,
        )
    except BaseException:
        # Conversations of the batches already started find their run gone and stop.
        runs.delete_run(url, run_id)
        raise
    every_case_ended = runs.start_run(url, run_id, total, run.started_at or first_started)
    if starter is not None:
        starter.started(run_id, every_case_ended)
    # After the start: the conversations under way replan once it commits.
    runs.keep_statistics(url, total)
    return total
