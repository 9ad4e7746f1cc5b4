"""A conversation's next turn played on what its worker kept, without reading it first.

A fleet turn reads its conversation before it plays (`step.prepare`): whether the turn
is still to be played, and whether its run may go on. When the conversation's previous
step was saved by this same process, which kept the state it saved (state_cache.py),
that read finds nothing new in the usual case: the row as this process wrote it, the run
as it was. So a continuing turn is played without it, and what the read would have
checked, the save checks instead (turn_statements.SAVE_KEPT): the step lands only if the
row still holds the token this process wrote (no copy of the turn, no person's reply,
nothing wrote the conversation since) and the run is not cancelled. When it does not
land, the turn's work is discarded, its calls counted in the run's usage as unrecorded
(as a losing duplicate's are), and the turn is read and decided as any delivery is: in
a cancelled run it ends skipped, and it is nothing more when a copy of it was recorded.
The price: a copy of a turn that another worker already played, reaching the process
that played the turn before it, calls its agent once more before its save is refused,
where the read would have stopped it first. The sweeper's copies cannot: it publishes a
turn again only once its run has not moved for AGENTTEST_STALL_SECONDS, and what was
kept longer ago than half that (at most CONTINUING_SECONDS) is read as before. What is
left is a publish retried after a reply lost on its way back, whose two copies come
together.

Only for a first delivery (a redelivery is counted, and runs alone: fleet/isolation.py),
in a run without a budget (its turns reserve against the run's totals as read: the
state is then kept without what the step read) and without a --deadline (whose states
are not kept). What it saves per turn: one database round trip and one hand-off to a
store thread and back (alternating pairs of benchmarks/throughput.py, 1,000 x 3: 378,
376, 433 -> 433, 400, 466 turns/s; benchmarks/RESULTS.md).
"""

from __future__ import annotations

from agenttest_worker.driver import state_cache
from agenttest_worker.driver.run_cache import options_of
from agenttest_worker.driver.step import Prepared
from agenttest_worker.settings import get_settings

# The longest a kept state is played on without reading the conversation: a continuing
# turn normally comes within seconds of the step before it (its message goes ahead of
# new conversations'), and a copy the sweeper published comes after a stall period.
CONTINUING_SECONDS = 30.0


def continuing(run_id: str, case_id: str, turn: int) -> Prepared | None:
    """Turn `turn` of the conversation, on what this process kept of it: a step whose
    save checks what a read would have (see above); None when it kept nothing for that
    turn, and the turn reads its conversation as usual."""
    within = min(CONTINUING_SECONDS, get_settings().stall_seconds / 2)
    found = state_cache.take_continuing(run_id, case_id, turn, within)
    if found is None:
        return None
    loaded, case, stored = found
    return Prepared(
        loaded,
        case,
        stored.state,
        options_of(loaded),
        turn,
        archived=stored.archived,
        kept_token=loaded.step_token,
    )
