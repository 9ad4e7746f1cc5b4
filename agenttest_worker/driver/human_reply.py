"""A person's reply to a conversation parked for their input (--interactive, or a
fleet's submitter asking): given to the engine and saved as the turn it answers would
be, with the same guards as a turn's step (driver/step.py)."""

from __future__ import annotations

from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.driver import state_cache
from agenttest_worker.driver.run_cache import pricing_config
from agenttest_worker.driver.step import Advance, commit, prepared_for, saved_or_refused, stopped
from agenttest_worker.engine import case_result, give_human_input
from agenttest_worker.store import steps
from agenttest_worker.store.conversation_store import ConversationStore


async def answer_human(
    store: ConversationStore,
    pool: AgentPool,
    run_id: str,
    case_id: str,
    text: str | None,
    reason: str | None = None,
) -> Advance:
    """A person's reply (or None: no reply came) to a conversation parked for input."""
    loaded = store.load_case(run_id, case_id)
    if loaded is None or loaded.phase != "awaiting_human":
        return Advance(saved=False)
    parked = (
        prepared_for(store, loaded, loaded.next_turn) if loaded.state or loaded.state_kept else None
    )
    if parked is None:
        return Advance(saved=False)
    if (unreadable := stopped(parked, None)) is not None and parked.unreadable is not None:
        return commit(store, parked, unreadable, "awaiting_human")  # as its turn would end
    loaded, case, options = parked.loaded, parked.case, parked.options
    new_state = await give_human_input(case, parked.state, text, pool, options, reason)
    result = None
    if new_state.phase == "done":
        result = case_result(case, new_state, loaded.agent, pricing_config(loaded))
    skipped_rows = [t for t in new_state.turns if t.turn >= loaded.next_turn]

    def save() -> Advance:
        step = steps.StepSave(
            run_id=run_id,
            case_id=case_id,
            expected_turn=loaded.next_turn,
            next_turn=loaded.next_turn,
            phase=new_state.phase,
            new_turns=skipped_rows,
            final_assertions=new_state.final_assertions if result else (),
            result=result,
            expected_phase="awaiting_human",
        )
        saved = state_cache.save(store, loaded, parked.archived, new_state, step)
        if not saved.saved:
            return Advance(saved=False)
        return Advance(
            saved=True,
            next_turn=loaded.next_turn if new_state.phase == "ready" else None,
            run_finished=saved.run_finished,
            case_done=result is not None,
            status=result.status if result else None,
            starts=saved.starts,
        )

    return saved_or_refused(store, run_id, case_id, loaded.next_turn, save)
