"""On a fleet, a case file mixing the negative, group and trajectory assertions is
validated by the submitter, played by a Celery worker, and its verdicts stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fault_kit import run_scripted_on_fleet
from fleet import write_cases
from test_trajectory_assertions import MOCKS, shop

from agenttest_worker.store.sql import run_results as results

pytestmark = pytest.mark.fleet


def test_new_assertion_types_run_on_a_worker(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    refund_flow = {
        "type": "tool_sequence",
        "order": "in_order",
        "calls": [{"name": "lookup_order"}, {"name": "issue_refund", "args": {"amount": 500}}],
    }
    cases = write_cases(
        tmp_path,
        [
            {
                "id": "F-refund",
                "turns": [
                    {
                        "input": "hi",
                        "assertions": [
                            {"type": "not_contains", "value": "refund"},
                            {"type": "tool_count", "max": 0},
                        ],
                    },
                    {
                        "input": "refund please",
                        "assertions": [
                            refund_flow,
                            {"type": "not_regex", "pattern": "(?i)sorry"},
                            {
                                "type": "any",
                                "assertions": [
                                    {"type": "contains", "value": "declined"},
                                    {"type": "tool_called", "name": "issue_refund"},
                                ],
                            },
                        ],
                    },
                ],
                "on_missing_input": "end",
                "tool_mocks": MOCKS,
                "final_assertions": [
                    {"type": "turn_count", "min": 2, "max": 2},
                    {"type": "tool_count", "name": "issue_refund", "max": 1},
                    {
                        "type": "not",
                        "assertion": {"type": "tool_not_called", "name": "issue_refund"},
                    },
                ],
            },
            {
                "id": "F-leak",
                "input": "refund please",
                "tool_mocks": MOCKS,
                "assertions": [
                    {"type": "tool_not_called", "name": "issue_refund", "args": {"amount": 500}},
                    {"type": "all", "assertions": [{"type": "not_contains", "value": "$500"}]},
                ],
            },
        ],
    )
    run_id = run_scripted_on_fleet(redis_db, pg_database, demo_url, tmp_path, cases, shop)
    report = results.get_report(pg_database, run_id, "jsonl")
    assert report is not None
    records = {r["id"]: r for r in map(json.loads, report.splitlines())}

    refund = records["F-refund"]
    assert refund["status"] == "passed", refund
    assert [len(t["assertions"]) for t in refund["turns"]] == [2, 3]
    assert all(a["passed"] for t in refund["turns"] for a in t["assertions"])
    assert [a["passed"] for a in refund["final_assertions"]] == [True, True, True]

    leak = records["F-leak"]
    assert leak["status"] == "failed"
    [turn] = leak["turns"]
    assert [(a["passed"], a["reason"]) for a in turn["assertions"]] == [
        (False, 'tool issue_refund was called with {"order": "A1", "amount": 500}'),
        (
            False,
            'all: 0 of 1 passed (not_contains failed: the reply contains "$500" at position '
            "15: Your refund of $500 for order A1 is on …)",
        ),
    ]
