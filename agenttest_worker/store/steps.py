"""What a conversation step loads and what it adds, as plain data: no database here.

The embedded runner starts its conversations before the store is set up (importing
SQLAlchemy and creating the run take a few tenths of a second, which the first agent
calls can overlap), so everything a step needs besides the store itself lives here,
away from SQLAlchemy. turns.py and buffered.py write these rows.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, NamedTuple

from agenttest_worker.case_definitions import CaseDefinition
from agenttest_worker.results import AgentCallRecord, AssertionResult, CaseResult, TurnResult

# A checked case as a run stores it: (case id, agent or None for the run's target,
# the case's normalized record).
CaseRecord = tuple[str, str | None, dict[str, Any]]


class CaseText(NamedTuple):
    """A case's normalized record as the text its run stores (`json.dumps` of it), with
    `test_id`, a repetition's case id (None for a case played once). The submitter's
    spool holds that text already: handed to the store as it is, a million-case run is
    not parsed back into objects only to be written out again."""

    text: str
    test_id: str | None
    # Its definition's hashes, taken where the record was still objects (None: taken
    # from the text when it is stored).
    definition: CaseDefinition | None = None


# A case on its way into the store: its record as objects, or as its text.
StoredCase = tuple[str, str | None, dict[str, Any] | CaseText]


class JsonText(str):
    """A JSON document already written as text (pydantic's `model_dump_json`), stored
    as it is: a long conversation's state is written every turn, and pydantic writes it
    several times faster than building the objects for `json.dumps` to write."""


# A JSON object as Python objects, or as its text: the database hands the conversation's
# case and state over as text, which pydantic reads without building them first, and
# which a worker that has the case in memory already does not read at all.
JsonDocument = dict[str, Any] | str


def as_object(document: JsonDocument | None) -> dict[str, Any] | None:
    """The document as Python objects (read from its text if that is what it is)."""
    if isinstance(document, str):
        parsed: dict[str, Any] = json.loads(document)
        return parsed
    return document


def new_run_id() -> str:
    """Sortable by time, unique across a fleet: 20261129-203512-3fa9c1."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


@dataclass
class LoadedCase:
    run_id: str
    case_id: str
    case: JsonDocument
    agent: str | None
    phase: str
    next_turn: int
    state: JsonDocument | None
    deliveries: int
    run_cancelled: bool
    cancel_reason: str | None
    run_options: dict[str, Any]
    run_config: dict[str, Any]
    deadline_at: float | None
    run_tokens: int = 0
    run_cost: float = 0.0
    # Running, and every conversation ended: only its aggregation is left to do.
    run_complete: bool = False
    # The token of the step that wrote the row last (`Saved.token`); None when unknown.
    step_token: str | None = None
    # The state was not read: the row still holds what this process saved last, whose
    # state it kept (kept_states.py); `state` is then None.
    state_kept: bool = False
    # A state that holds only its later turns (engine/state.py `earlier_turns`): the
    # earlier turns' results, as one JSON array's text, in order (models.TurnRecordRow).
    turn_records: str | None = None
    # And its earlier messages (`earlier_messages`), stored with those records, as one
    # JSON array's text, in order; None when none are stored apart.
    turn_messages: str | None = None


@dataclass(frozen=True, slots=True)
class RepeatPlan:
    """A repetition of a case played with `--repeat auto`, as the step that ends it hands
    it to the store: the store decides, from the case's repetitions stored so far, whether
    to add the next one (store/repetition_chain.py), in the same write as the end."""

    # The case's id (the repetitions' `test_id`), and the key of each repetition it may
    # have, in order (`keys[n - 1]` is repetition n's).
    test_id: str
    keys: tuple[str, ...]
    # The stopping rule (report/repeat_stopping.py `next_repetition`, its pass rule and
    # bound given): the number of the repetition to add, from the statuses of the case's
    # repetitions that ended and how many exist; None: add none.
    next_repetition: Callable[[Sequence[str], int], int | None]


@dataclass(frozen=True, slots=True)
class StepSave:
    """One step of a conversation to save, as the driver hands it over: where it ran, how
    it leaves the conversation and what it adds; its state is written out by the driver
    (`Step`).

    Saved only if the conversation is still at `expected_turn` (and running, or parked in
    `expected_phase`): a duplicate or stale copy of the step changes nothing.
    """

    run_id: str
    case_id: str
    # The turn the step ran: the conversation's `next_turn` when it was loaded (the guard).
    expected_turn: int
    # The turn the conversation waits for next.
    next_turn: int
    # The phase the conversation is left in: ready, awaiting_human or done.
    phase: str
    # The turns the step played (or skipped), each with its assertions and agent calls.
    new_turns: Sequence[TurnResult]
    # The case's final assertions, when the step ended the case.
    final_assertions: Sequence[AssertionResult] = ()
    # The case's record, when the step ended the case (the run's counters move with it).
    result: CaseResult | None = None
    # The phase the conversation is parked in instead of running (a person's reply being
    # saved: awaiting_human); None for a step of a running conversation.
    expected_phase: str | None = None
    # (tokens, cost) to add to the run's totals with this step (runs with a budget
    # account per turn); None: the case's tokens and cost are added once, when it ends.
    spend: tuple[int, float] | None = None
    # The run has a budget: the step releases its conversation's reservation
    # (store/reservations.py), and its `budget_turns` turns join the run's average
    # usage per turn, the next turns' estimate.
    budgeted: bool = False
    budget_turns: int = 0
    # When the step ends the case: cancel the run with this reason in the same write
    # (--fail-fast after a failed case), so that the write starts nothing new.
    stop_run: str | None = None
    # When the step ends a repetition of a case played with --repeat auto.
    repeat_plan: RepeatPlan | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Step(StepSave):
    """A `StepSave` with the conversation's state as it is stored
    (`ConversationStore.save_step`)."""

    # The conversation's state after the step (engine.ConversationState), often as text.
    state: JsonDocument
    # Earlier turns' results that left the state with this step, as (position, JSON
    # text): stored as turn records (models.TurnRecordRow), only by a store whose
    # `keeps_turn_records` says so. A step that ends the case deletes its records.
    archive: Sequence[tuple[int, str]] = ()
    # The messages that left the state with this step (engine/state.py
    # `earlier_messages`), as the inside of a JSON array (`a,b`): stored with the last of
    # `archive`'s records.
    archive_messages: str | None = None

    @classmethod
    def of(
        cls,
        step: StepSave,
        state: JsonDocument,
        archive: Sequence[tuple[int, str]] = (),
        archive_messages: str | None = None,
    ) -> Step:
        given = {f.name: getattr(step, f.name) for f in fields(StepSave)}
        return cls(**given, state=state, archive=archive, archive_messages=archive_messages)


@dataclass(frozen=True)
class Saved:
    saved: bool
    run_finished: bool = False
    # Conversations (by `seq`, first..last) this step claimed to start: a run capped by
    # --parallel on a fleet starts the next ones as others end. None: none to start.
    starts: tuple[int, int] | None = None
    # The token the step was written with (LoadedCase.step_token of the next load), when
    # the store stamps its steps; None otherwise.
    token: str | None = None
    # The conversation this step added, to start now: the next repetition of a case
    # played with --repeat auto (StepSave.repeat_plan).
    added: str | None = None


def claimed(claimed_from: int | None, started: int | None) -> tuple[int, int] | None:
    """The seq range first..last a claim moved `started_cases` over, or None."""
    if claimed_from is None or started is None or started <= claimed_from:
        return None
    return claimed_from, started - 1


def turn_rows(run_id: str, case_id: str, turns: Iterable[TurnResult]) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "case_id": case_id,
            "turn": t.turn,
            "input": t.input,
            "input_source": t.input_source,
            "output": t.output,
            "tool_calls": [c.model_dump(mode="json", exclude_none=True) for c in t.tool_calls],
            "awaiting_input": t.awaiting_input,
            "status": t.status,
            "duration_ms": t.duration_ms,
            "error": t.error,
            "skip_reason": t.skip_reason,
        }
        for t in turns
    ]


def assertion_rows(
    run_id: str, case_id: str, turn: int, results: Sequence[AssertionResult]
) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "case_id": case_id,
            "turn": turn,
            "position": i,
            "type": r.type,
            "passed": r.passed,
            "reason": r.reason,
            "detail": r.model_dump(mode="json"),
        }
        for i, r in enumerate(results)
    ]


def call_rows(
    run_id: str, case_id: str, turn: int, calls: Sequence[AgentCallRecord]
) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "case_id": case_id,
            "turn": turn,
            "position": i,
            "role": c.role,
            "agent": c.agent,
            "latency_ms": c.latency_ms,
            "attempts": c.attempts,
            "status_code": c.status_code,
            "prompt_tokens": c.usage.prompt_tokens if c.usage else 0,
            "completion_tokens": c.usage.completion_tokens if c.usage else 0,
            "total_tokens": c.usage.total_tokens if c.usage else 0,
            "error": c.error,
        }
        for i, c in enumerate(calls)
    ]


@dataclass
class StepRows:
    """The rows one step adds: its turns, their assertions (and the case's final ones,
    as turn 0), and their agent calls; or, added up, several steps' (BufferedStore)."""

    turns: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    # Earlier turns' results that left the conversation's state (Step.archive).
    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def none(cls) -> StepRows:
        return cls([], [], [])

    def add(self, more: StepRows) -> None:
        """Append `more`'s rows (a buffer of several steps' rows)."""
        self.turns.extend(more.turns)
        self.verdicts.extend(more.verdicts)
        self.calls.extend(more.calls)
        self.records.extend(more.records)

    def __bool__(self) -> bool:
        return bool(self.turns or self.verdicts or self.calls or self.records)


def step_rows(
    run_id: str,
    case_id: str,
    new_turns: Sequence[TurnResult],
    final_assertions: Sequence[AssertionResult],
) -> StepRows:
    verdicts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for turn in new_turns:
        verdicts += assertion_rows(run_id, case_id, turn.turn, turn.assertions)
        calls += call_rows(run_id, case_id, turn.turn, turn.calls or [])
    verdicts += assertion_rows(run_id, case_id, 0, final_assertions)
    return StepRows(turn_rows(run_id, case_id, new_turns), verdicts, calls)


def step_spend(spend: tuple[int, float] | None, result: CaseResult | None) -> tuple[int, float]:
    """(tokens, cost) a step adds to its run's totals.

    With `spend` (runs with a budget account per turn) that; without, a case's tokens
    and cost are added once, when it ends, from its record's usage by role: priced as
    a budgeted run's turns are (driver/budget_counting.py), a cached call at 0, so that
    `runs.total_cost` is the run's cost whether it had a budget or not.
    """
    if spend is not None:
        return spend
    if result is None:
        return 0, 0.0
    tokens = result.usage.total_tokens if result.usage else 0
    cost = sum(found.cost for found in (result.usage_by_role or {}).values())
    return tokens, round(cost, 9)


def record_rows(step: Step) -> list[dict[str, Any]]:
    """The turn records (models.TurnRecordRow) of a step's `archive`, the last with the
    messages that left the state with them."""
    last = len(step.archive) - 1
    return [
        {
            "run_id": step.run_id,
            "case_id": step.case_id,
            "position": position,
            "record": record,
            "messages": step.archive_messages if i == last else None,
        }
        for i, (position, record) in enumerate(step.archive)
    ]
