"""A conversation's documents are stored as the JSON written: a run on a fleet reports an
agent's tool call arguments and reported state with their keys in the agent's order,
as an embedded run does (Postgres jsonb used to reorder them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fault_kit import run_scripted_on_fleet
from fleet import write_cases
from scripted_agent import Reply
from sqlalchemy import text

from agenttest_worker.store.sql import db
from agenttest_worker.store.sql import run_results as results

# Keys neither sorted nor in jsonb's order (shorter keys first), nested.
ARGS = {"zeta": 1, "alpha": {"yy": 1, "b": 2}, "mid": [{"z": 0, "a": 1}]}
STATE = {"step": "review", "amount": 12, "a": True}


def _reply(body: dict[str, Any]) -> Reply:
    return Reply(content="noted", tool_calls=[{"name": "file_expense", "args": ARGS}], state=STATE)


def _keys(value: Any) -> Any:
    """The value's object keys, in order, nested (what equality of dicts ignores)."""
    if isinstance(value, dict):
        return [(key, _keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_keys(item) for item in value]
    return None


@pytest.mark.fleet
def test_a_fleet_run_keeps_the_agents_key_order(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    cases = write_cases(
        tmp_path,
        [
            {
                "id": "ordered",
                "type": "multi_turn",
                "turns": [
                    {"input": "file it", "assertions": [{"type": "contains", "value": "noted"}]},
                    {"input": "again", "assertions": [{"type": "contains", "value": "noted"}]},
                ],
            }
        ],
    )
    run_id = run_scripted_on_fleet(redis_db, pg_database, demo_url, tmp_path, cases, _reply)
    report = results.get_report(pg_database, run_id, "jsonl")
    assert report is not None
    record = json.loads(report)
    for turn in record["turns"]:
        args = turn["tool_calls"][0]["args"]
        assert args == ARGS
        assert _keys(args) == _keys(ARGS)
    # The state the next turn was played from (and --reeval reads) keeps it too.
    with db.get_engine(pg_database).connect() as connection:
        state = connection.execute(
            text("SELECT state::text FROM cases WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
    stored = json.loads(state)
    assert _keys(stored["turns"][0]["tool_calls"][0]["args"]) == _keys(ARGS)
    assert _keys(stored["agent_state"]) == _keys(STATE)


def test_the_documents_columns_are_json_on_postgres(pg_database: str) -> None:
    db.upgrade(pg_database)
    with db.get_engine(pg_database).connect() as connection:
        types = dict(
            connection.execute(
                text(
                    "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                    " WHERE attrelid = 'cases'::regclass AND attname IN ('case', 'state', 'result')"
                )
            ).all()
        )
    assert types == {"case": "json", "state": "json", "result": "json"}


def test_a_case_given_as_text_is_stored_as_its_record_would_be(
    pg_database: str, tmp_path: Path
) -> None:
    """A fleet's submitter hands the store each case's record as the text its spool
    holds: the rows are those the record itself gives, on Postgres and SQLite alike
    (the column's text, a NUL made storable, a repetition's case id, a case stored
    twice kept once)."""
    from agenttest_worker.store import steps
    from agenttest_worker.store.sql import runs
    from agenttest_worker.store.storable import dumps_storable

    record = {"id": "T1", "zeta": "é\u0000", "turns": [{"input": "hi", "b": 1, "a": 2}]}
    repetition = {**record, "repetition": 2}
    for url in (pg_database, f"sqlite:///{tmp_path / 'store.db'}"):
        db.upgrade(url)
        stored: dict[str, list[Any]] = {}
        for how in ("record", "text"):
            run_id = steps.new_run_id()
            runs.create_run(url, run_id=run_id, agent=None, input_label="t", options={}, config={})

            def case(doc: dict[str, Any], test_id: str | None, how: str = how) -> Any:
                return doc if how == "record" else steps.CaseText(json.dumps(doc), test_id)

            batch = [
                runs.NewCase(0, "T1", case(record, None), "a"),
                runs.NewCase(1, "T1#2", case(repetition, "T1"), None),
                runs.NewCase(2, "T1", case(record, None), "b"),  # already there: ignored
            ]
            assert runs.add_cases(url, run_id, batch) == 3
            with db.get_engine(url).connect() as connection:
                stored[how] = connection.execute(
                    text(
                        'SELECT case_id, test_id, seq, CAST("case" AS text), agent, phase,'
                        " next_turn, deliveries, reserved_tokens, reserved_cost FROM cases"
                        " WHERE run_id = :r ORDER BY seq"
                    ),
                    {"r": run_id},
                ).all()
        assert stored["text"] == stored["record"], url
        rows = stored["text"]
        assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
            ("T1", None, 0, "a"),
            ("T1#2", "T1", 1, None),
        ]
        if url == pg_database:
            assert rows[0][3] == dumps_storable(record)
            assert "\\ufffd" in rows[0][3]


def test_cases_copied_to_postgres_keep_every_character(pg_database: str) -> None:
    """A batch with no case already stored is written with COPY: ids, agents and records
    holding COPY's own separators and escapes (tab, newline, backslash, the \\N of a
    missing value) are stored as given, a record's NUL made storable."""
    from agenttest_worker.store import steps
    from agenttest_worker.store.sql import runs
    from agenttest_worker.store.storable import dumps_storable

    db.upgrade(pg_database)
    run_id = steps.new_run_id()
    runs.create_run(pg_database, run_id=run_id, agent=None, input_label="t", options={}, config={})
    awkward = 'tab\there\nline\r\\N back\\slash "q" \u0000 é'
    record = {"id": awkward, "input": awkward, "turns": [{"input": "a\\tb"}]}
    repetition = {**record, "repetition": 2}
    batch = [
        runs.NewCase(0, awkward, steps.CaseText(json.dumps(record), None), "\\N"),
        runs.NewCase(1, awkward + "#2", steps.CaseText(json.dumps(repetition), awkward), None),
        runs.NewCase(2, "plain", {"id": "plain", "input": awkward}, "agent\twith tab"),
    ]
    assert runs.add_cases(pg_database, run_id, batch) == 3
    with db.get_engine(pg_database).connect() as connection:
        rows = connection.execute(
            text(
                'SELECT case_id, test_id, seq, CAST("case" AS text), agent, phase, next_turn,'
                " deliveries FROM cases WHERE run_id = :r ORDER BY seq"
            ),
            {"r": run_id},
        ).all()
    assert [tuple(r) for r in rows] == [
        (
            awkward.replace("\u0000", "\ufffd"),
            None,
            0,
            dumps_storable(record),
            "\\N",
            "pending",
            1,
            0,
        ),
        (
            awkward.replace("\u0000", "\ufffd") + "#2",
            awkward.replace("\u0000", "\ufffd"),
            1,
            dumps_storable(repetition),
            None,
            "pending",
            1,
            0,
        ),
        (
            "plain",
            None,
            2,
            dumps_storable({"id": "plain", "input": awkward}),
            "agent\twith tab",
            "pending",
            1,
            0,
        ),
    ]


def test_a_run_whose_label_holds_a_nul_is_stored_on_postgres(pg_database: str) -> None:
    """Postgres text cannot hold U+0000: the run's texts are stored with U+FFFD instead,
    as its cases' are."""
    from agenttest_worker.store import steps
    from agenttest_worker.store.sql import runs

    db.upgrade(pg_database)
    run_id = steps.new_run_id()
    runs.create_run(
        pg_database, run_id=run_id, agent=None, input_label="a \x00 label", options={}, config={}
    )
    run = runs.get_run(pg_database, run_id)
    assert run is not None and run.input_label == "a \ufffd label"
    runs.delete_run(pg_database, run_id)
    assert runs.get_run(pg_database, run_id) is None
