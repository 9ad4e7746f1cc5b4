"""A step's save finds its conversation by primary key on Postgres, however many of the
run's conversations share its phase and whatever the statistics say.

The guarded UPDATE that saves a step names the conversation (run, case) and checks its
phase. Postgres could serve it from the (run_id, phase) index as well, and did: on a new
run's cases, with no statistics yet (or statistics of earlier, smaller runs), both
indexes look like one row, and the phase index then read every conversation of the run
in that phase, 10,000 at 10,000 turns in flight (benchmarks/RESULTS.md). Each plan here
is the one Postgres picks for the text the hot path sends (store/sql/turns.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql import turn_statements as sql
from agenttest_worker.store.sql.db import get_engine, upgrade

IN_FLIGHT = 3000


def _add_run(conn: psycopg.Connection[Any], run_id: str, cases: int, phase: str) -> None:
    conn.execute(
        "INSERT INTO runs (id, status, options, config, total_cases, finished_cases, passed,"
        " failed, skipped, total_turns, total_tokens, total_cost, cancelled)"
        " VALUES (%s, 'running', '{}', '{}', %s, 0, 0, 0, 0, 0, 0, 0, false)",
        (run_id, cases),
    )
    conn.execute(
        'INSERT INTO cases (run_id, case_id, seq, "case", phase, next_turn, deliveries,'
        " step_token, updated_at)"
        " SELECT %s, 'c' || g, g, '{}', %s, 2, 0, 't' || g, now()"
        " FROM generate_series(1, %s) AS g",
        (run_id, phase, cases),
    )


@pytest.fixture
def database(empty_pg_database: str) -> Iterator[str]:
    upgrade(empty_pg_database)
    with psycopg.connect(empty_pg_database, autocommit=True) as conn:
        # The statistics are the test's to set: none, or those of earlier runs.
        conn.execute("ALTER TABLE cases SET (autovacuum_enabled = false)")
    yield empty_pg_database
    get_engine.cache_clear()


def _cases_scans(url: str, statement: str, params: dict[str, Any]) -> list[Any]:
    """The plan nodes that read `cases` when `statement` runs with `params` (rolled back)."""
    with psycopg.connect(url) as conn:
        explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.for_psycopg(statement)
        row = conn.execute(explain, params).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    found: list[Any] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "cases" and node["Node Type"] != "ModifyTable":
            found.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


def _step_params(phases: tuple[str, str]) -> dict[str, Any]:
    return {
        "b_run": "big",
        "b_case": "c77",
        "b_turn": 2,
        "b_next": 3,
        "b_phase": "ready",
        "b_from": phases[0],
        "b_or_from": phases[1],
        "b_state": None,
        "b_status": None,
        "b_result": None,
        "b_token": "new",
    }


# The phases a save may find its conversation in (turns.save_step), and the phase the
# test's conversations are in.
GUARDS = {
    "running": (("pending", "ready"), "ready"),
    "parked": (("awaiting_human", "awaiting_human"), "awaiting_human"),
}


def _assert_by_primary_key(scans: list[Any]) -> None:
    assert len(scans) == 1
    scan = scans[0]
    shown = {k: scan.get(k) for k in ("Index Name", "Index Cond", "Rows Removed by Filter")}
    assert scan.get("Index Name") == "cases_pkey", shown
    assert scan.get("Rows Removed by Filter", 0) <= 1, shown
    # It found the conversation (the statement ran, then was rolled back).
    assert scan["Actual Rows"] == 1


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_a_save_finds_its_row_by_primary_key_with_statistics_of_smaller_runs(
    database: str, guard: str
) -> None:
    """Statistics of earlier runs, mostly ended, make "this run's conversations in this
    phase" look like one row: the guard's phase is checked on the row the primary key
    found (turn_statements.SAVE_GUARDED)."""
    phases, phase = GUARDS[guard]
    with psycopg.connect(database, autocommit=True) as conn:
        for number in range(50):
            _add_run(conn, f"small{number}", 20, "done")
        conn.execute("ANALYZE cases")
        _add_run(conn, "big", IN_FLIGHT, phase)

    _assert_by_primary_key(_cases_scans(database, sql.SAVE_GUARDED, _step_params(phases)))


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_a_run_larger_than_the_statistics_know_has_the_cases_analyzed_as_it_starts(
    database: str, guard: str
) -> None:
    """A new database (or autovacuum off): no statistics at all, and Postgres took the
    smallest index on run_id for the conversation's read and save. The run's writer
    analyzes the table once the run has started (runs.keep_statistics), as the
    submitter's storing does."""
    phases, phase = GUARDS[guard]
    with psycopg.connect(database, autocommit=True) as conn:
        _add_run(conn, "big", IN_FLIGHT, phase)
        known = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'cases'").fetchone()
        assert known is not None and known[0] < 0  # never analyzed

    runs.keep_statistics(database, IN_FLIGHT)

    _assert_by_primary_key(_cases_scans(database, sql.SAVE_GUARDED, _step_params(phases)))
    load = sql.load("postgresql")
    _assert_by_primary_key(
        _cases_scans(database, load, {"b_run": "big", "b_case": "c77", "b_known": "t77"})
    )


def test_statistics_that_know_the_run_are_left_as_they_are(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        _add_run(conn, "first", 500, "done")
        conn.execute("ANALYZE cases")
        _add_run(conn, "second", 100, "ready")
        runs.keep_statistics(database, 100)  # 100 < the 500 the statistics know: left
        left = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'cases'").fetchone()
        runs.keep_statistics(database, 1000)  # more than they know: analyzed
        analyzed = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'cases'").fetchone()
    assert left == (500,)
    assert analyzed == (600,)
