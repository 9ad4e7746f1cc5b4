"""The turn's statements as the hot path sends them on Postgres (store/sql/turns.py): SQL
text (store/sql/turn_statements.py) sent through psycopg with its own placeholders, the
step that ends a conversation included, saved whole by its one statement."""

from __future__ import annotations

from typing import Any

import psycopg

from agenttest_worker.results import (
    AgentCallRecord,
    AssertionResult,
    CaseResult,
    TurnResult,
    Usage,
)
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql import turn_statements as sql
from agenttest_worker.store.sql.db import upgrade
from agenttest_worker.store.steps import Step, new_run_id

USAGE = Usage(prompt_tokens=10, completion_tokens=3, total_tokens=13)


def _turn(number: int) -> TurnResult:
    return TurnResult(
        turn=number,
        input=f"message {number}",
        input_source="static",
        output="Noted, thank you.",
        assertions=[AssertionResult(type="contains", passed=True, reason="found 'Noted'")],
        calls=[
            AgentCallRecord(
                role="target",
                agent="bench",
                latency_ms=50,
                attempts=1,
                status_code=200,
                usage=USAGE,
            )
        ],
        duration_ms=51,
    )


def test_a_conversations_last_step_is_saved_whole_by_its_one_long_statement(
    pg_database: str,
) -> None:
    upgrade(pg_database)
    run_id = new_run_id()
    runs.create_run(
        pg_database, run_id=run_id, agent="bench", input_label="t", options={}, config={}
    )
    case = {"id": "c0", "turns": [{"input": "message 1"}]}
    runs.add_cases(pg_database, run_id, [runs.NewCase(0, "c0", case, None)])
    runs.start_run(pg_database, run_id, 1)
    played = _turn(1)
    saved = SqlStore(pg_database).save_step(
        Step(
            run_id=run_id,
            case_id="c0",
            expected_turn=1,
            next_turn=2,
            phase="done",
            state={"case_id": "c0", "session_id": "s", "phase": "done", "messages": []},
            new_turns=[played],
            result=CaseResult(id="c0", status="passed", turns=[played], total_turns=1, usage=USAGE),
        )
    )

    assert saved.saved and saved.run_finished
    with psycopg.connect(pg_database) as conn:
        # (The session's database: other tests' runs are there too.)
        def of_run(query: str) -> list[tuple[Any, ...]]:
            return conn.execute(query + " WHERE run_id = %s", (run_id,)).fetchall()

        assert of_run("SELECT turn, output, status FROM turns") == [
            (1, "Noted, thank you.", "passed")
        ]
        assert of_run("SELECT type, passed, reason FROM assertion_results") == [
            ("contains", True, "found 'Noted'")
        ]
        assert of_run("SELECT role, agent, prompt_tokens FROM agent_calls") == [
            ("target", "bench", 10)
        ]
        assert of_run("SELECT phase, status, result->>'status' FROM cases") == [
            ("done", "passed", "passed")
        ]
        row = conn.execute(
            "SELECT finished_cases, passed, total_turns, total_tokens FROM runs WHERE id = %s",
            (run_id,),
        ).fetchone()
        assert row == (1, 1, 1, 13)


def test_a_statement_is_sent_with_psycopgs_placeholders(pg_database: str) -> None:
    """Each `:name` is psycopg's `%(name)s`, a name used twice included; a colon
    inside a word is left as it is."""
    statement = "SELECT :b_first, :b_second, :b_first, 'a:b'"
    sent = sql.for_psycopg(statement)
    assert sent == "SELECT %(b_first)s, %(b_second)s, %(b_first)s, 'a:b'"
    with psycopg.connect(pg_database) as conn:
        row = conn.execute(sent, {"b_first": "one", "b_second": "two"}).fetchone()
    assert row == ("one", "two", "one", "a:b")
