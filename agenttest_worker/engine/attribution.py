"""Why a case failed or was skipped, read from its record: `input`, `infrastructure`,
`simulator`, `judge` or `agent` (report/causes.py adds `flake` over a run's records, and
`judge` for criteria an audit found unstable).

The causes are tried in this order, the first that fits wins:
- `input`: the case ran out of input (`on_missing_input: fail`, or `skip` with no turn
  left to play);
- `infrastructure`: a call failed for good for reasons outside every agent's answer (a
  timeout, no connection, an HTTP 5xx or 429 after the retries, an open circuit
  breaker), a turn's or the case's time limit, or the run stopped before the case ended
  (a budget, a cancellation, `--fail-fast`, the run's deadline);
- `simulator`: the simulator failed (an error, a reply that is not a simulator's, or one
  that says it left its persona), or it ran out of turns without reaching its goal;
- `judge`: every failed assertion is a judge's whose votes split;
- `agent`: anything else: an assertion about the target's reply or tools failed, or the
  target answered with something that is not a reply.
"""

from __future__ import annotations

from agenttest_worker.engine.state import (
    MAX_TURNS_EXCEEDED,
    MISSING_INPUT_FAILS,
    NO_NEXT_TURN,
    SIMULATOR_ERROR,
)
from agenttest_worker.results import (
    DEADLINE_PASSED,
    AgentCallRecord,
    AssertionResult,
    CaseResult,
    Cause,
    TurnResult,
)

# How the skip reason of a case its run stopped before it played begins (driver/step.py,
# driver/budget_counting.py), and how a time limit's error begins (engine/turn.py).
NOT_RUN = "not run: "
TIMEOUT = "timeout after "


def infrastructure_call(call: AgentCallRecord) -> bool:
    """A call that failed for reasons outside the agent's answer: no reply came (a
    timeout, no connection, an open breaker: no status and nothing read), or an HTTP
    429 or 5xx after the retries."""
    if call.error is None:
        return False
    status = call.status_code
    if status is None:
        return call.reply is None
    return status == 429 or status >= 500


def failed_assertions(record: CaseResult) -> list[AssertionResult]:
    """Every assertion of the record that failed, turn by turn, then the final ones."""
    checked = [a for t in record.turns for a in t.assertions] + list(record.final_assertions)
    return [a for a in checked if not a.passed]


def split_vote(assertion: AssertionResult) -> bool:
    """A judge's verdict its own votes disagree on (some passed, some failed)."""
    return (
        assertion.votes is not None
        and assertion.agreement is not None
        and assertion.agreement < 1
        and assertion.error is None
    )


def _stopped(record: CaseResult) -> bool:
    skip = record.skip_reason or ""
    error = record.error or ""
    return (
        skip.startswith(NOT_RUN)
        or error == DEADLINE_PASSED
        or error.startswith(TIMEOUT)
        or any((t.error or "").startswith(TIMEOUT) for t in record.turns)
    )


def _calls(turns: list[TurnResult]) -> list[AgentCallRecord]:
    return [c for t in turns for c in t.calls or ()]


def _missing_input(record: CaseResult) -> bool:
    if (record.error or "").endswith(MISSING_INPUT_FAILS):
        return True
    # `on_missing_input: skip`: a turn with no input and no source ends it.
    return record.status == "skipped" and any(
        t.status == "skipped" and t.input is None and t.input_source is None for t in record.turns
    )


def _simulator(record: CaseResult) -> bool:
    if (record.skip_reason or "").startswith(SIMULATOR_ERROR):
        return True
    out_of_turns = (record.error or "").startswith(MAX_TURNS_EXCEEDED)
    return out_of_turns and record.simulator is not None and record.goal_achieved is not True


def case_cause(record: CaseResult) -> Cause | None:
    """Why the record failed or was skipped; None for a passed one."""
    if record.status == "passed":
        return None
    if _missing_input(record) or record.skip_reason == NO_NEXT_TURN:
        return "input"
    errored = [t for t in record.turns if t.error is not None or t.status == "skipped"]
    decisive = errored[:1] or record.turns[-1:]
    if _stopped(record) or any(infrastructure_call(c) for c in _calls(decisive)):
        return "infrastructure"
    failed = failed_assertions(record)
    # Every failing assertion could not be decided, and a judge's call failed so.
    undecided = bool(failed) and all(a.error is not None for a in failed)
    if undecided and any(
        infrastructure_call(c) for c in _calls(record.turns) if c.role == "validator"
    ):
        return "infrastructure"
    if _simulator(record):
        return "simulator"
    if failed and all(split_vote(a) for a in failed) and record.error is None:
        return "judge"
    return "agent"
