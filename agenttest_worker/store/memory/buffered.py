"""The embedded runner's store: one run's conversations in memory, written in batches.

Workers use `base.SqlStore`, which goes to the database on every step, so that any
worker can take any turn and nothing is lost when one dies. `BufferedStore` is the
embedded runner's: one process owns the whole run, so conversations are kept in memory,
with the same guards (a step is saved once, at the turn it ran), and what they produce
is written to the same tables in batches. A run interrupted mid-way loses at most the
last half second of turns, which `agenttest-submit resume` runs again.

Nothing here imports SQLAlchemy until it touches the database. The store's work runs
on a thread of its own, in order: a new embedded run's BufferedStore starts from the
cases in memory while that thread imports the store and writes the run (its `setup`,
`BufferedStore.fresh`), so that its first conversations overlap that start-up instead
of waiting for it; then each flush is handed to it as plain data (flush_batch.py,
`flush_writes.write_flush`) while the conversations go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agenttest_worker.results import RoleUsage, UsageRole, usage_spend
from agenttest_worker.store import repetition_chain, reservations, steps
from agenttest_worker.store.memory.admission import Admission
from agenttest_worker.store.memory.buffered_run import BufferedRun, HeldConversation, read_run
from agenttest_worker.store.memory.flush_batch import (
    BufferedStep,
    CaseWrite,
    FlushBatch,
    RunChanges,
    RunTotals,
    StepRecord,
    StepRefused,
    Unplayed,
    take_off,
)

_TIMER_TICK = 0.05  # seconds: the shortest wait of flush_on_timer
# Seconds between two tries of a write the database refused for now, waited for.
_REFUSED_PAUSE = 0.5


@dataclass
class _Unwritten:
    """A conversation's steps since the last write, and the conversation as written."""

    written: HeldConversation
    steps: list[BufferedStep]


@dataclass(frozen=True)
class _Sent:
    """A write handed to the store's thread: what it holds, and its outcome to come."""

    unwritten: dict[str, _Unwritten]
    changes: RunChanges
    reply: Future[list[StepRefused]]


# Writes one flush to the database at a URL; says which steps it refused (flush_writes).
FlushWriter = Callable[[str, FlushBatch], list[StepRefused]]


@dataclass(frozen=True)
class Refused:
    """A conversation whose step `turn` the database refused (see BufferedStore.flush)."""

    case_id: str
    turn: int
    reason: str
    # The status its refused steps had ended the case with (already counted), if any.
    ended_as: str | None


class BufferedStore(reservations.MemoryReservations):
    """One run's conversations in memory, written to the database in batches."""

    def __init__(
        self,
        url: str,
        run_id: str,
        run: BufferedRun,
        conversations: dict[str, HeldConversation],
        *,
        flush_every: float = 0.5,
        setup: Callable[[], object] | None = None,
        writes: FlushWriter | None = None,
    ) -> None:
        self.url = url
        # What writes a flush (a test passes one that fails the way it needs).
        self._writes: FlushWriter = writes or _write_flush
        # The store's work, in order: see the module's docstring.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agenttest-store")
        self._setup = self._thread.submit(setup) if setup is not None else None
        self.run_id = run_id
        self.run = run
        self.conversations = conversations
        self.flush_every = flush_every
        self._last_flush = time.monotonic()
        self._unwritten: dict[str, _Unwritten] = {}
        self._changes = RunChanges()
        # The write handed to the store's thread whose outcome is not yet taken.
        self._sent: _Sent | None = None
        self._refused: list[Refused] = []
        # Why the database refuses this store's writes for now (a statement timeout, the
        # disk full: db.transient_refusal), and since when (time.monotonic); None while
        # it takes them. Its steps are kept meanwhile, and written once it takes them.
        self.refusing: str | None = None
        self._refusing_since = 0.0
        # A fresh run's cases not yet taken (`admit`): none of a stored run's.
        self._admission = Admission(iter(()), admitted=len(conversations))
        # The status of each repetition of --repeat auto let go of once ended: what
        # `_chain` decides the next one from.
        self._ended_repetitions: dict[str, str] = {}

    @classmethod
    def fresh(
        cls,
        url: str,
        run_id: str,
        records: Iterable[steps.CaseRecord],
        total: int,
        *,
        options: dict[str, Any],
        config: dict[str, Any],
        deadline_at: float | None,
        setup: Callable[[], object],
    ) -> BufferedStore:
        """A run not yet started: its `total` cases as `runs.add_cases` stores them, the
        run as `runs.start_run` leaves it. `setup` stores them, on the store's thread,
        while the conversations start; nothing is written before it is done.

        The cases are taken from `records` as they are played (`admit`), not before:
        a run of a million cases holds only those under way."""
        run = BufferedRun(
            options=options,
            config=config,
            cancelled=False,
            cancel_reason=None,
            deadline_at=deadline_at,
            status="running",
            total_cases=total,
            finished_cases=0,
            total_tokens=0,
            total_cost=0.0,
            counters={"passed": 0, "failed": 0, "skipped": 0, "total_turns": 0},
        )
        store = cls(url, run_id, run, {}, setup=setup)
        store._admission = Admission(iter(records))
        return store

    @classmethod
    def from_database(
        cls, url: str, run_id: str, writes: FlushWriter | None = None
    ) -> BufferedStore:
        """A stored run as it is now (a run being resumed). `writes`: see __init__."""
        run, conversations = read_run(url, run_id)
        return cls(url, run_id, run, conversations, writes=writes)

    def admit(self) -> str | None:
        """The next case not yet played, now held here as a pending conversation; None
        once every case was taken."""
        if (ahead := self._admission.ahead()) is not None:
            return ahead
        taken = self._admission.take()
        if taken is None:
            return None
        self._hold(taken)
        return taken[0]

    def _hold(self, taken: steps.CaseRecord) -> None:
        case_id, agent, record = taken
        self.conversations[case_id] = HeldConversation(record, agent, "pending", 1, None, 0)

    def admitting(self) -> Iterator[tuple[str, int]]:
        """(case id, first turn) of each case as it is admitted: what the lanes take."""
        while (case_id := self.admit()) is not None:
            yield case_id, 1

    def end_unadmitted(self, reason: str) -> int:
        """End every case never admitted, failed with `reason` (a --deadline): counted
        here at once, and ended in the database by one statement of the next flush
        (store/sql/unplayed.py), after the steps it holds. How many it ended."""
        admitted = self._admission.close()
        ended = self.run.total_cases - admitted
        if ended <= 0:
            return 0
        self.run.finished_cases += ended
        self.run.counters["failed"] += ended
        self._changes.add(RunChanges(unplayed=Unplayed(admitted, reason)))
        return ended

    def load_case(
        self, run_id: str, case_id: str, count_delivery: bool = False, turn: int | None = None
    ) -> steps.LoadedCase | None:
        found = self.conversations.get(case_id) if run_id == self.run_id else None
        if found is None:
            return None
        run = self.run
        return steps.LoadedCase(
            run_id=run_id,
            case_id=case_id,
            case=found.case,
            agent=found.agent,
            phase=found.phase,
            next_turn=found.next_turn,
            # The step validates this into its own objects; it never changes ours.
            state=found.state,
            deliveries=found.deliveries,
            run_cancelled=run.cancelled,
            cancel_reason=run.cancel_reason,
            run_options=run.options,
            run_config=run.config,
            deadline_at=run.deadline_at,
            run_tokens=run.total_tokens,
            run_cost=run.total_cost,
        )

    def save_step(self, step: steps.Step) -> steps.Saved:
        case_id, result = step.case_id, step.result
        found = self.conversations.get(case_id) if step.run_id == self.run_id else None
        if found is None or found.next_turn != step.expected_turn:
            return steps.Saved(False)
        allowed = ("pending", "ready") if step.expected_phase is None else (step.expected_phase,)
        if found.phase not in allowed:
            return steps.Saved(False)
        unwritten = self._unwritten.get(case_id)
        if unwritten is None:
            unwritten = self._unwritten[case_id] = _Unwritten(dataclasses.replace(found), [])
        found.next_turn, found.phase, found.state = step.next_turn, step.phase, step.state
        found.deliveries = 0
        tokens, cost = steps.step_spend(step.spend, result)
        if result is not None:
            found.result = StepRecord(
                steps.JsonText(result.model_dump_json()), result.status, result.total_turns
            )
        unwritten.steps.append(
            BufferedStep(
                turn=step.expected_turn,
                next_turn=step.next_turn,
                phase=step.phase,
                state=step.state,
                result=found.result if result is not None else None,
                rows=steps.step_rows(step.run_id, case_id, step.new_turns, step.final_assertions),
                tokens=tokens,
                cost=cost,
            )
        )
        run = self.run
        run.total_cost += cost
        run.total_tokens += tokens
        self.release_reservation(case_id, step.budget_turns)
        if result is None:
            return steps.Saved(True)
        # (Not for a run stopping: cancelled, or by this step's --fail-fast.)
        chains = step.repeat_plan and step.stop_run is None and not run.cancelled
        added = self._chain(step.repeat_plan, found) if chains and step.repeat_plan else None
        # A repetition that adds the next hands its place over (repetition_chain.py).
        run.finished_cases += 0 if added else 1
        run.counters[result.status] += 1
        run.counters["total_turns"] += result.total_turns
        finished = run.status == "running" and run.finished_cases >= run.total_cases
        return steps.Saved(True, run_finished=finished, added=added)

    def _chain(self, plan: steps.RepeatPlan, ending: HeldConversation) -> str | None:
        """The next repetition of `plan`'s case, added when its stored ones ask for it."""
        # Its first repetitions, written one after the other, are all held before the
        # decision, as they are all stored on a fleet (`admit` hands them out next).
        for taken in self._admission.take_ahead(plan.test_id):
            self._hold(taken)
        stored: dict[str, str | None] = {}
        for key in plan.keys:
            if (found := self.conversations.get(key)) is not None:
                stored[key] = None if found.result is None else found.result.status
            elif key in self._ended_repetitions:
                stored[key] = self._ended_repetitions[key]
        added = repetition_chain.next_key(plan, stored)
        if added is None or added in stored:
            return None
        key = added
        record = repetition_chain.successor_record(ending.case, key, plan)
        self.conversations[key] = HeldConversation(record, ending.agent, "pending", 1, None, 0)
        # Its row, copied from a stored repetition's, is written first by the next flush.
        source = next(k for k in plan.keys if k in stored)
        self._changes.added.append((key, source, json.dumps(record)))
        return key

    def cancel_run(self, run_id: str, reason: str) -> bool:
        if run_id != self.run_id or self.run.cancelled:
            return False
        self.run.cancelled, self.run.cancel_reason = True, reason
        self._changes.cancel = reason
        return True

    def add_unrecorded_usage(self, run_id: str, usage: Mapping[UsageRole, RoleUsage]) -> None:
        if run_id == self.run_id and usage:
            # Into runs.usage at the next flush; the totals are written from memory.
            tokens, cost = usage_spend(usage)
            self.run.total_tokens += tokens
            self.run.total_cost += cost
            self._changes.add(RunChanges(usage=dict(usage)))

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush < self.flush_every:
            return
        if self._setup is not None and not self._setup.done():
            return  # the run is still being stored: keep buffering, never wait here
        self.flush(wait=False)

    async def flush_on_timer(self, write: Callable[[], None]) -> None:
        """Call `write` (the caller's maybe_flush) whenever a flush falls due, until
        cancelled. Steps alone flush only when a conversation saves one: with a 4 s
        agent, a run killed outright lost 3 of 4 finished first turns, held in memory
        through the quiet stretch. An empty buffer costs nothing (`flush` returns)."""
        while True:
            due = self._last_flush + self.flush_every - time.monotonic()
            # A tick at least: a flush put off while the run is stored must not spin.
            await asyncio.sleep(max(due, _TIMER_TICK))
            write()

    def flush(self, wait: bool = True, told: Callable[[], None] | None = None) -> None:
        """Write everything saved since the last flush, in one transaction (once the
        run's setup, if any, is done: waits for it, and raises what it raised).

        A write the database refuses for now (`refusing`: a statement timeout, the disk
        full) is kept and written again by the next flush, without raising, for up to
        AGENTTEST_STORE_RETRY_SECONDS: the turns played are not lost, nor played (their
        agents called) again. With `wait`, this tries again until it is written, calling
        `told()` after each try (the caller says why it waits).

        Without `wait`, the write is handed to the store's thread and this returns at
        once (it runs while the conversations go on); its outcome is taken at the next
        flush, which raises what it raised. A write that fails is rolled back, and what
        it held is written by the next flush.

        When the database refuses a value one of the steps holds (db.unstorable_reason),
        the steps are written again one by one, each in a savepoint: the others are
        written, and each conversation with a refused step goes back to how it was
        before that step (its later steps dropped), listed by `take_refused` for its
        caller to end (a worker ends such a case in `driver.step.commit_or_fail`; this
        store only learns of the refusal here, after the step was played).
        """
        self._flush_once(wait)
        while wait and self.refusing is not None:
            if told is not None:
                told()
            time.sleep(_REFUSED_PAUSE)
            self._flush_once(wait)
        if wait and told is not None:
            told()

    def _flush_once(self, wait: bool) -> None:
        if self._setup is not None:
            self._setup.result()
            self._setup = None
        self._collect()
        self._last_flush = time.monotonic()
        unwritten, self._unwritten = self._unwritten, {}
        changes, self._changes = self._changes, RunChanges()
        if not unwritten and not changes:
            return
        try:
            reply = self._thread.submit(self._writes, self.url, self._batch(unwritten, changes))
        except BaseException:
            self._put_back(unwritten, changes)
            raise
        self._sent = _Sent(unwritten, changes, reply)
        if wait:
            self._collect()

    def _collect(self) -> None:
        """The outcome of the write handed over last, if any (waited for)."""
        sent = self._sent
        if sent is None:
            return
        try:
            refused = sent.reply.result()
        except BaseException as exc:
            if sent.reply.done() and sent.reply.exception() is not None:
                self._sent = None
                self._put_back(sent.unwritten, sent.changes)
                if self._refused_for_now(exc):
                    return
            # Else the wait was interrupted (Ctrl-C, SIGTERM) while the thread writes:
            # the next flush (the run's cleanup) takes its outcome.
            raise
        self._sent = None
        self.refusing = None
        for found in refused:
            pending = sent.unwritten[found.case_id]
            self._refused.append(
                self._take_back(found.case_id, pending, found.position, found.reason)
            )
        self._forget_ended(sent.unwritten)

    def _forget_ended(self, written: Iterable[str]) -> None:
        """Conversations whose end is written are not kept: the database has them, and
        a run of a million cases would hold every record. (Any step for one of them
        finds it gone, as it would find it ended: nothing to play.)"""
        for case_id in written:
            conversation = self.conversations.get(case_id)
            if conversation is None or conversation.phase != "done":
                continue
            if case_id in self._unwritten:
                continue
            if conversation.result is not None and "#" in case_id:
                # (A repetition's key, repetition_key: only those are chained.)
                self._ended_repetitions[case_id] = conversation.result.status
            del self.conversations[case_id]

    def _refused_for_now(self, exc: BaseException) -> bool:
        """Whether the write failed with the database refusing it for now, not for
        longer than AGENTTEST_STORE_RETRY_SECONDS (then it is kept, and `refusing` says
        why)."""
        # The store's SQLAlchemy modules only once it is used: see the module docstring.
        from sqlalchemy.exc import DBAPIError

        from agenttest_worker.settings import get_settings
        from agenttest_worker.store.sql.db import error_reason, transient_refusal

        refusal = transient_refusal(exc.orig) if isinstance(exc, DBAPIError) else None
        if refusal is None:
            return False
        now = time.monotonic()
        if self.refusing is None:
            self._refusing_since = now
        self.refusing = f"{refusal} ({error_reason(exc)})"
        return now - self._refusing_since < get_settings().store_retry_seconds

    def _put_back(self, unwritten: dict[str, _Unwritten], changes: RunChanges) -> None:
        """A write that failed (rolled back) is kept for the next flush, before what was
        saved since, which the run's own cleanup would otherwise lose."""
        for case_id, later in self._unwritten.items():
            if case_id in unwritten:
                unwritten[case_id].steps += later.steps
            else:
                unwritten[case_id] = later
        self._unwritten = unwritten
        changes.add(self._changes)
        self._changes = changes

    def take_refused(self) -> list[Refused]:
        """The conversations whose steps the database refused since last asked."""
        refused, self._refused = self._refused, []
        return refused

    def _batch(self, unwritten: dict[str, _Unwritten], changes: RunChanges) -> FlushBatch:
        run = self.run
        return FlushBatch(
            run_id=self.run_id,
            cases=[
                CaseWrite(case_id, self.conversations[case_id].values(), pending.steps)
                for case_id, pending in unwritten.items()
            ],
            run=RunTotals(run.finished_cases, run.total_tokens, run.total_cost, dict(run.counters)),
            changes=changes,
        )

    def _take_back(self, case_id: str, pending: _Unwritten, index: int, reason: str) -> Refused:
        """The conversation as it was before its step `index`, that step and the ones
        after it (those saved since it was handed over too) taken off the run's
        counters."""
        conversation = self.conversations[case_id]
        before = pending.steps[index - 1] if index else None
        newer = self._unwritten.pop(case_id, None)
        dropped = pending.steps[index:] + (newer.steps if newer is not None else [])
        ended = take_off(self.run, dropped)
        status = ended.status if ended is not None else None
        self._set(conversation, pending.written if before is None else before)
        return Refused(case_id, dropped[0].turn, reason, status)

    @staticmethod
    def _set(conversation: HeldConversation, to: HeldConversation | BufferedStep) -> None:
        conversation.next_turn, conversation.phase = to.next_turn, to.phase
        conversation.state, conversation.result = to.state, to.result
        conversation.deliveries = 0


def _write_flush(url: str, batch: FlushBatch) -> list[StepRefused]:
    """flush_writes.write_flush, imported where it runs (the store's thread)."""
    # The store's SQLAlchemy modules only once it is used: see the module docstring.
    from agenttest_worker.store.memory.flush_writes import write_flush

    return write_flush(url, batch)
