"""`--repeat auto` where a repetition ends: what the step hands the store so that it can
add the case's next repetition in the same write (store/repetition_chain.py reads the
case's repetitions as stored; report/repeat_stopping.py is the rule). The same on a
fleet and embedded: both save a conversation's last step through driver/step.py's
`commit`."""

from __future__ import annotations

import functools

from agenttest_worker.cases.case_model import Case, repetition_key
from agenttest_worker.engine import RunOptions
from agenttest_worker.report.repeat_stopping import next_repetition
from agenttest_worker.store.steps import RepeatPlan


def repeat_plan(case: Case, options: RunOptions) -> RepeatPlan | None:
    """The plan of a repetition of a case played with --repeat auto, else None."""
    if case.max_repeat is None or case.repetition is None:
        return None
    keys = tuple(repetition_key(case.id, n) for n in range(1, case.max_repeat + 1))
    rule = functools.partial(next_repetition, options.pass_rule, case.max_repeat)
    return RepeatPlan(test_id=case.id, keys=keys, next_repetition=rule)
