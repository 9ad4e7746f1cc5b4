"""A new run stored through psycopg alone (store/postgres_run.py) is the run the SQLAlchemy
store writes, row for row, and a fleet's `--no-wait` submission gets there without
importing SQLAlchemy."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from agenttest_submit.storing import write_run
from agenttest_worker.store import runs, steps
from agenttest_worker.store.db import upgrade
from agenttest_worker.store.new_run import NewCase, NewRun, RunWrites
from agenttest_worker.store.postgres_run import PostgresRunWrites, connection_lost, libpq_url
from tests.test_cli_run import SUITE_CONFIG, submit_env
from tests.test_leaving import SCRIPT
from tests.test_plain_http import _imported

# Every column but the ones that differ between two runs created one after the other.
_DIFFERENT = {"id", "created_at", "started_at", "updated_at"}


def _row(url: str, table: str, where: str, value: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as connection:
        cursor = connection.execute(
            f"SELECT * FROM {table} WHERE {where} = %s ORDER BY 1, 2", (value,)
        )
        names = [column.name for column in cursor.description or []]
        return [
            {
                name: value
                for name, value in zip(names, found, strict=True)
                if name not in _DIFFERENT and name != "run_id"
            }
            for found in cursor.fetchall()
        ]


def _new_run(run_id: str, label: str = "cases.jsonl «quoted»") -> NewRun:
    # Awkward values on purpose: quotes, a non-ASCII name, an escaped NUL, None as usage.
    return NewRun(
        run_id=run_id,
        agent="assistants.expense",
        input_label=label,
        options={"target": "assistants.expense", "repeat": 3, "awaiting_tools": ["ask"]},
        config={"agents": {"a": {"base_url": "http://x", "headers": {"k": "\\u0000"}}}},
        parent_run_id=None,
        deadline_at=1234.5,
        suite='suite "q"',
        usage=None,
    )


def _cases() -> list[NewCase]:
    record = {"id": "T1", "input": "tab\there\nnewline \x00 nul", "turns": None}
    text = steps.CaseText(json.dumps({"id": "T1", "repetition": 2}), "T1")
    return [
        NewCase(0, "T1", record, "a"),
        NewCase(1, "T1#2", text, None),
        NewCase(2, "back\\slash", {"id": "back\\slash"}, "agent\twith tab"),
    ]


def _write(writes: RunWrites, run_id: str) -> bool:
    try:
        writes.create_run(_new_run(run_id))
        assert writes.add_cases(run_id, _cases()) == 3
        # Written again: the stored rows are kept (COPY refuses; the INSERT ignores).
        assert writes.add_cases(run_id, _cases()[:1]) == 1
        return writes.start_run(run_id, 3)
    finally:
        writes.close()


def test_psycopg_writes_the_run_and_cases_the_models_write(pg_database: str) -> None:
    upgrade(pg_database)
    ours, theirs = f"pg-{secrets.token_hex(4)}", f"sa-{secrets.token_hex(4)}"
    libpq = libpq_url(pg_database)
    assert libpq is not None
    assert _write(PostgresRunWrites(libpq), ours) is False
    assert _write(runs.SqlAlchemyRunWrites(pg_database), theirs) is False
    ours_run, theirs_run = (
        _row(pg_database, "runs", "id", ours),
        _row(pg_database, "runs", "id", theirs),
    )
    assert ours_run == theirs_run and len(ours_run) == 1
    assert ours_run[0]["status"] == "running" and ours_run[0]["total_cases"] == 3
    ours_cases = _row(pg_database, "cases", "run_id", ours)
    assert ours_cases == _row(pg_database, "cases", "run_id", theirs) and len(ours_cases) == 3
    # A run whose cases could not all be stored is removed with them.
    writes = PostgresRunWrites(libpq)
    try:
        # A NUL, which Postgres text cannot hold (the models' insert fails on it).
        nul = f"nul-{secrets.token_hex(4)}"
        writes.create_run(_new_run(nul, "a \x00 label"))
        assert _row(pg_database, "runs", "id", nul)[0]["input_label"] == "a \ufffd label"
        writes.delete_run(nul)
        writes.delete_run(ours)
    finally:
        writes.close()
    assert _row(pg_database, "runs", "id", ours) == []
    assert _row(pg_database, "cases", "run_id", ours) == []


def test_a_database_behind_the_head_revision_is_not_current(empty_pg_database: str) -> None:
    libpq = libpq_url(empty_pg_database)
    assert libpq is not None
    writes = PostgresRunWrites(libpq)
    try:
        assert writes.revision() is None and not writes.current_schema()
        upgrade(empty_pg_database)
        assert writes.current_schema()
    finally:
        writes.close()


def test_only_psycopg_urls_are_written_by_psycopg() -> None:
    assert libpq_url("postgresql://u:p@h:5/db?sslmode=require") == (
        "postgresql://u:p@h:5/db?sslmode=require"
    )
    assert libpq_url("postgres://h/db") == "postgresql://h/db"
    assert libpq_url("PostgreSQL+psycopg://h/db") == "postgresql://h/db"
    assert libpq_url("postgresql+psycopg2://h/db") is None
    assert libpq_url("sqlite:///x.db") is None


def test_a_refused_connection_is_a_lost_one_and_a_bad_statement_is_not(pg_database: str) -> None:
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("postgresql://postgres@127.0.0.1:1/x", connect_timeout=5)
    assert connection_lost(refused.value)
    with psycopg.connect(pg_database) as connection, pytest.raises(psycopg.Error) as wrong:
        connection.execute("SELECT * FROM no_such_table")
    assert not connection_lost(wrong.value)


def test_a_fleet_submission_stores_its_run_without_sqlalchemy(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """`--no-wait` on a fleet: the run and its cases stored, its start published, and
    neither SQLAlchemy nor the watch imported on the way. Stored by the submitter's own
    process (AGENTTEST_STORE_PROCESS=never), whose imports alone are then on stderr; the
    forked store's process runs the same storing (test_fleet_storing.py)."""
    upgrade(pg_database)
    queue = f"test-{secrets.token_hex(4)}"  # consumed by no worker of the suite
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "".join(json.dumps({"id": f"N{n}", "input": "Hello"}) + "\n" for n in range(7))
    )
    env = submit_env(tmp_path / "home") | {
        "AGENTTEST_BROKER_URL": redis_db,
        "AGENTTEST_DATABASE_URL": pg_database,
        "AGENTTEST_QUEUE": queue,
        "AGENTTEST_DEMO_URL": demo_url,
        "AGENTTEST_STORE_PROCESS": "never",
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    argv = ["-i", str(cases), "--config", SUITE_CONFIG, "-n", "assistants.expense"]
    client = redis.Redis.from_url(redis_db)
    try:
        done = subprocess.run(
            [str(SCRIPT), *argv, "--no-wait"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        modules = _imported(done)
        assert "agenttest_worker.store.postgres_run" in modules
        assert "sqlalchemy" not in modules and "agenttest_submit.fleet_watch" not in modules
        run_id = done.stderr.split("run ", 1)[1].split(":", 1)[0]
        run = _row(pg_database, "runs", "id", run_id)
        assert run[0]["status"] == "running" and run[0]["total_cases"] == 7
        assert len(_row(pg_database, "cases", "run_id", run_id)) == 7
        started = [
            json.loads(m) for key in client.keys(f"{queue}*") for m in client.lrange(key, 0, -1)
        ]
        assert [m["headers"]["task"] for m in started] == ["agenttest.start"]
    finally:
        for key in client.keys(f"{queue}*"):
            client.delete(key)


def test_a_run_written_to_an_empty_database_migrates_it_first(empty_pg_database: str) -> None:
    """No schema yet: Alembic brings it to the head, then psycopg writes the run."""
    run_id = f"new-{secrets.token_hex(4)}"
    records = [(c.case_id, c.agent, c.case) for c in _cases()]
    stored = write_run(
        empty_pg_database,
        run_id,
        records,
        options={},
        config={},
        target=None,
        label="empty",
        deadline_at=None,
    )
    assert stored == 3
    assert _row(empty_pg_database, "runs", "id", run_id)[0]["status"] == "running"
    assert len(_row(empty_pg_database, "cases", "run_id", run_id)) == 3
