"""Conversations a run never started, ended in one statement (an embedded run's
`--deadline`): each gets the record `engine.outcome.case_result` gives a case ended
before its first turn, built by the database from the stored case.

Ended one step at a time, a 1,000,000-case run past its deadline spent minutes on the
cases it never played, and held every record in memory meanwhile. The record here is
the same one (tests/test_unplayed_cases.py compares the two): the fields every such
record shares are a template, and the case's own (its id, name, tags, where it is
written, its repetition, its simulator) are read from its stored document. A field
the case does not have is left out, as the model leaves it out.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, text

from agenttest_worker.results import RESULT_VERSION


def _template(reason: str) -> str:
    return json.dumps(
        {
            "version": RESULT_VERSION,
            "name": None,
            "status": "failed",
            "turns": [],
            "final_assertions": [],
            "total_turns": 0,
            "duration_ms": 0,
            "error": reason,
            # A run stopped before the case ended: the infrastructure's, as
            # engine/attribution.py says of it.
            "cause": "infrastructure",
        }
    )


# The case's own fields, by the record's name: (the path in the stored case, SQLite's
# JSON path). A repetition's `repeats` is its case's `repeat`, only on a repetition.
_SQLITE = """
UPDATE cases SET phase = 'done', status = 'failed', state = NULL, deliveries = 0,
  updated_at = CURRENT_TIMESTAMP,
  result = json_patch(:template, json_object(
    'id', json_extract("case", '$.id'),
    'name', json_extract("case", '$.name'),
    'agent', agent,
    'simulator', json_extract("case", '$.simulator.use'),
    'tags', json_extract("case", '$.tags'),
    'file', json_extract("case", '$.source_file'),
    'line', json_extract("case", '$.source_line'),
    'repeat', json_extract("case", '$.repetition'),
    'repeats', CASE WHEN json_extract("case", '$.repetition') IS NOT NULL
                    THEN json_extract("case", '$.repeat') END))
WHERE run_id = :run_id AND seq >= :from_seq AND phase = 'pending'
"""

# jsonb_strip_nulls leaves out what the case does not have (a case's name may be null:
# the template's null stays then, as the model keeps it).
_POSTGRES = """
UPDATE cases SET phase = 'done', status = 'failed', state = NULL, deliveries = 0,
  updated_at = now(),
  result = CAST(:template AS jsonb) || jsonb_strip_nulls(jsonb_build_object(
    'id', "case" -> 'id',
    'name', "case" -> 'name',
    'agent', to_jsonb(agent),
    'simulator', "case" -> 'simulator' -> 'use',
    'tags', "case" -> 'tags',
    'file', "case" -> 'source_file',
    'line', "case" -> 'source_line',
    'repeat', "case" -> 'repetition',
    'repeats', CASE WHEN "case" -> 'repetition' IS NOT NULL THEN "case" -> 'repeat' END))
WHERE run_id = :run_id AND seq >= :from_seq AND phase = 'pending'
"""


def end_unplayed(connection: Connection, run_id: str, from_seq: int, reason: str) -> int:
    """End, failed with `reason`, every conversation of the run from submission
    position `from_seq` on that has not started; how many it ended."""
    statement = _SQLITE if connection.dialect.name == "sqlite" else _POSTGRES
    params: dict[str, Any] = {"template": _template(reason), "run_id": run_id, "from_seq": from_seq}
    return connection.execute(text(statement), params).rowcount
