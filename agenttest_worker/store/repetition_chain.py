"""The next repetition of a case played with `--repeat auto`, added by the step that
ends one of its repetitions, in the same write (both stores).

The decision is made from the case's repetitions as stored, by the rule the step hands
over (report/repeat_stopping.py, through driver/adaptive_repeats.py): how many exist,
and how those that ended ended. A repetition's key (`T1#4`) is the
`cases` row's key, so two steps can never add the same one; and a step's end and what
it adds are one write (SqlStore: one transaction that holds the run row's lock before
it reads the repetitions; the embedded store: one call on its event loop's thread), so
two repetitions ending at once never both add one, nor both leave the case undecided:
the second sees the first's end.

A repetition that adds the next one hands its place in the run's count of
conversations to it: the run's `finished_cases` moves only when a chain of
repetitions ends (turn_statements.CASE_ENDED), so a run is complete when every chain
has ended, and a run capped by --parallel on a fleet keeps its cap. Its counts of
passed, failed and skipped conversations count every repetition played.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agenttest_worker.store.steps import JsonDocument, RepeatPlan, as_object


def next_key(plan: RepeatPlan, stored: Mapping[str, str | None]) -> str | None:
    """The key of the repetition to add, or None. `stored`: the case's repetitions
    stored, each key with its status (None while it plays)."""
    ended = [status for status in stored.values() if status is not None]
    number = plan.next_repetition(ended, len(stored))
    return None if number is None else plan.keys[number - 1]


def successor_record(case: JsonDocument, key: str, plan: RepeatPlan) -> dict[str, Any]:
    """The stored case record of repetition `key`, from another repetition's."""
    record = as_object(case)
    assert record is not None
    return {**record, "repetition": plan.keys.index(key) + 1}


def successor_text(case: JsonDocument, key: str, plan: RepeatPlan) -> str:
    return json.dumps(successor_record(case, key, plan))
