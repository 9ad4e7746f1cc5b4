"""A conversation's state between steps: kept in memory, and saved without old turns.

Two costs used to grow with a conversation's length, every turn: parsing its whole
stored state (every message and every earlier turn's result) when a step loads it, and
writing all of it again when the step is saved. benchmarks/long_conversation.py
measures a turn at turn ~3 and ~50.

- Kept states. A worker that saves a step keeps the state it saved, by the step's
  token (store/kept_states.py). When the next turn of that conversation comes to the
  same process and the row still holds that token, the store does not even send the
  state, and the kept object is played on. Any other write in between (another worker
  played a turn, a person replied) changes the token, and the state is read and parsed
  as before: the store stays the only shared truth, and any worker can play any turn.
  An entry is taken out when used and put back only by a saved step, so a failed save
  leaves none behind.
- Turn records. With a store that keeps them (`keeps_turn_records`), the stored state
  holds only its last turn; the earlier turns' results are rows of their own
  (models.TurnRecordRow), each written once, by the step after the one that played it
  (when the next turn can no longer change it), and read back, in one statement with
  the state, only when the state was not kept. A step plays on a state without its
  earlier turns (it counts how many ran): they stay the text they were written or read
  as until the conversation's end, when its final assertions and its record read them
  (ConversationState.restore_turns). So neither a step's CPU nor a waiting
  conversation's memory holds every earlier turn as objects. The step that ends the
  case stores the whole state (what reports and re-evaluations read) and drops the
  records.
- Messages. The conversation as its agent is sent it only grows: a step stores the
  messages added since the last it stored apart once, with its last turn record
  (`earlier_messages`), instead of the whole conversation again (which Postgres
  checked, compressed and logged at every step). A worker holds them all, as objects,
  for the next call; a state read from the store gets them back from the records.

A run with an agent read from its chat history (`history:` in agenttest.yaml) saves
whole states: reading the history may rewrite earlier turns (engine/history_turns.py). So
does a conversation whose stored state was whole (stored before turn records existed,
or by a store without them), to its end.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from agenttest_worker.driver.run_cache import case_of, run_config, validated
from agenttest_worker.engine import ConversationState, start_conversation
from agenttest_worker.errors import ConfigError
from agenttest_worker.json_values import compact_json
from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import ConversationStore
from agenttest_worker.store.kept_states import KEPT


@dataclass
class Stored:
    """A conversation's state as a step found it, and how it is stored.

    `archived`: how many of `state.turns` (the first ones) are stored as turn records;
    None when the conversation's state is stored whole (and stays so)."""

    state: ConversationState
    archived: int | None


@dataclass(frozen=True)
class _Kept:
    stored: Stored
    next_turn: int
    phase: str


def take_kept(loaded: steps.LoadedCase) -> Stored | None:
    """The state this process kept for `loaded` (LoadedCase.state_kept), taken out: the
    step now owns it. None when it is gone (another thread of this process took it, or
    it was pushed out): the caller then reads the state from the store."""
    if loaded.step_token is None:
        return None
    kept = KEPT.take(loaded.run_id, loaded.case_id, loaded.step_token)
    if not isinstance(kept, _Kept):
        return None
    if (kept.next_turn, kept.phase) != (loaded.next_turn, loaded.phase):
        return None  # the row moved without a step of ours: never expected, but not ours
    return kept.stored


def parse(loaded: steps.LoadedCase) -> Stored:
    """The stored state of `loaded` (not None). Its earlier turns, when stored as turn
    records, stay the text they were loaded as until the conversation's end reads them
    (ConversationState.restore_turns): a step does not parse every earlier turn."""
    assert loaded.state is not None
    state = validated(ConversationState, loaded.state)
    count = state.earlier_turns
    if count is None:
        return Stored(state, None)
    if count and not loaded.turn_records:
        # A store that does not hand turn records back (a wrapper, or the embedded store
        # over a fleet's run): better to stop than to play on without the turns.
        raise LookupError(
            f"conversation {loaded.case_id} of run {loaded.run_id}: its state holds its "
            f"turns after the first {count}, and no earlier turns were loaded"
        )
    state.earlier_records = (loaded.turn_records,) if count and loaded.turn_records else ()
    _restore_messages(state, loaded)
    if state.earlier_run is None:
        # Stored before states counted their earlier turns run: read them back now.
        state.restore_turns()
    return Stored(state, count)


def _restore_messages(state: ConversationState, loaded: steps.LoadedCase) -> None:
    """Put the messages stored apart back before the state's own: the next call sends
    the whole conversation. LookupError when they did not all come back."""
    apart = state.earlier_messages
    if not apart:
        return
    # The store hands them back as one JSON array (turns.load_case), or None.
    earlier = json.loads(loaded.turn_messages) if loaded.turn_messages else []
    if len(earlier) != apart:
        raise LookupError(
            f"conversation {loaded.case_id} of run {loaded.run_id}: its state holds its "
            f"messages after the first {apart}, and {len(earlier)} earlier messages were loaded"
        )
    state.messages[:0] = earlier


def keep(loaded: steps.LoadedCase, saved: steps.Saved, step: steps.Step, stored: Stored) -> None:
    """Keep the state of a saved step (`stored`: as it is now stored) for the next turn."""
    if saved.token is None or step.phase == "done":
        KEPT.forget(loaded.run_id, loaded.case_id)
        return
    KEPT.keep(loaded.run_id, loaded.case_id, saved.token, _Kept(stored, step.next_turn, step.phase))


def forget(loaded: steps.LoadedCase) -> None:
    KEPT.forget(loaded.run_id, loaded.case_id)


class StoredForm(NamedTuple):
    """How a step's state is stored (`stored_form`)."""

    # The state's text to store.
    text: steps.JsonText
    # The turn records to add (steps.Step.archive), and the messages stored with them.
    archive: Sequence[tuple[int, str]]
    archive_messages: str | None
    # The state to keep in memory; None when it is stored whole.
    compact: ConversationState | None


def stored_form(state: ConversationState, archived: int | None, compact: bool) -> StoredForm:
    """`state` whole, or without its earlier turns and messages when `compact`.

    The state kept holds what was stored: its turns after the archived ones, and the
    archived ones as the text just written and the text they were loaded or kept as
    (`earlier_records`): a conversation waiting for its next turn holds its earlier
    results as text, not as objects, which take more than twice the memory."""
    if not compact or archived is None or state.phase == "done":
        state.restore_turns()
        return StoredForm(steps.JsonText(state.stored_json()), (), None, None)
    held = state.earlier_turns or 0  # turns before `state.turns`, already archived
    assert held == archived or held == 0, (held, archived)
    # The last turn stays in the state: the next step may still complete it (a
    # simulator's verdict, a person's reply), and a person's terminal reads it there.
    keep_from = max(archived, held + len(state.turns) - 1)
    archive = [(i, state.turns[i - held].model_dump_json()) for i in range(archived, keep_from)]
    moved = state.turns[: keep_from - held]
    records = state.earlier_records
    if held < archived:
        # Read back whole (stored before states counted their turns run): what was
        # archived before is among `moved` without its text.
        records = ("[" + ",".join(t.model_dump_json() for t in moved[: archived - held]) + "]",)
    if archive:
        records = (*records, "[" + ",".join(text for _, text in archive) + "]")
    # The messages since those stored apart leave with the last record (they only
    # grow: a whole state, a history run's, is never compacted).
    apart, messages = state.earlier_messages or 0, None
    if archive and len(state.messages) > apart:
        written = compact_json(state.messages[apart:])
        if written is not None:  # else they stay in the state, written as before
            messages, apart = written.decode()[1:-1], len(state.messages)
    compact_state = state.model_copy(
        update={
            "turns": state.turns[keep_from - held :],
            "earlier_turns": keep_from,
            "earlier_run": (state.earlier_run or 0) + sum(1 for t in moved if t.input is not None),
            "earlier_records": records,
            "earlier_messages": apart or None,
        }
    )
    return StoredForm(steps.JsonText(compact_state.stored_json()), archive, messages, compact_state)


_history_runs: dict[str, bool] = {}
_history_lock = threading.Lock()


def compacts(store: object, loaded: steps.LoadedCase) -> bool:
    """Whether a step of `loaded` saves its state without the earlier turns."""
    if not getattr(store, "keeps_turn_records", False):
        return False
    with _history_lock:
        found = _history_runs.get(loaded.run_id)
    if found is None:
        try:
            agents = run_config(loaded.run_id, loaded.run_config).agents.values()
            found = not any(getattr(agent, "history", None) is not None for agent in agents)
        except ConfigError:
            found = False  # the conversation ends failed without calling anyone
        with _history_lock:
            if len(_history_runs) > 256:
                _history_runs.clear()
            _history_runs[loaded.run_id] = found
    return found


def session_id(run_id: str, case_id: str) -> str:
    return f"agenttest-{run_id}-{case_id}"


def stored(loaded: steps.LoadedCase) -> Stored:
    """The state of `loaded` as stored (parsed), or a new one before its first turn."""
    if loaded.state is None:
        return Stored(
            start_conversation(case_of(loaded), session_id(loaded.run_id, loaded.case_id)), 0
        )
    return parse(loaded)


def load(
    store: ConversationStore, loaded: steps.LoadedCase
) -> tuple[steps.LoadedCase, Stored] | None:
    """The state a step plays on, with the load it came with: kept by this process, or
    as stored. None when the kept state was gone and the conversation moved meanwhile
    (read again, it is no longer where it was loaded)."""
    if loaded.state_kept:
        kept = take_kept(loaded)
        if kept is not None:
            return loaded, kept
        # Gone: read it from the store (whose next load no longer skips it).
        again = store.load_case(loaded.run_id, loaded.case_id)
        if again is None or (again.next_turn, again.phase, again.step_token) != (
            loaded.next_turn,
            loaded.phase,
            loaded.step_token,
        ):
            return None
        # The state with what is stored apart from it: its earlier turns and messages.
        loaded = replace(
            loaded,
            state=again.state,
            turn_records=again.turn_records,
            turn_messages=again.turn_messages,
            state_kept=False,
        )
    else:
        # Whatever this process kept for the conversation is not what the store holds.
        forget(loaded)
    return loaded, stored(loaded)


def save(
    store: ConversationStore,
    loaded: steps.LoadedCase,
    archived: int | None,
    state: ConversationState,
    step: steps.StepSave,
) -> steps.Saved:
    """Save `step` of `loaded`, which leaves it in `state`: the state whole or without
    its earlier turns (see the module docstring), and then kept for the next turn. A
    run with a --deadline reads the state again when a turn is cut short at it
    (driver/step.py execute_until_deadline): its states are not kept."""
    text, archive, messages, compact = stored_form(state, archived, compacts(store, loaded))
    written = steps.Step.of(step, text, archive, messages)
    saved = store.save_step(written)
    if saved.saved and loaded.deadline_at is None:
        kept = Stored(state, None) if compact is None else Stored(compact, compact.earlier_turns)
        keep(loaded, saved, written, kept)
    return saved
