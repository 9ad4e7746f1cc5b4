"""The schema: migrations reach the models' tables, and start-up recognizes a current database."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from agenttest_worker.store import steps
from agenttest_worker.store.sql import db, runs
from agenttest_worker.store.sql.models import Base


def test_head_revision_constant_matches_the_migrations() -> None:
    config = Config()
    config.set_main_option("script_location", str(db.MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_current_head() == db.HEAD_REVISION


def _columns(url: str) -> dict[str, set[str]]:
    engine = create_engine(url)
    inspector = inspect(engine)
    return {t: {c["name"] for c in inspector.get_columns(t)} for t in inspector.get_table_names()}


def test_migrations_build_exactly_the_models_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    db.upgrade(url)
    tables = _columns(url)
    tables.pop("alembic_version")
    expected = {t.name: {c.name for c in t.columns} for t in Base.metadata.sorted_tables}
    assert tables == expected


def test_upgrade_on_postgres_is_idempotent(pg_database: str) -> None:
    db.upgrade(pg_database)
    db._upgraded.clear()  # a new process: it finds the database current and does nothing
    db.upgrade(pg_database)
    with db.get_engine(pg_database).connect() as connection:
        assert db.current_revision(connection) == db.HEAD_REVISION


def test_a_fresh_embedded_database_matches_a_migrated_one(tmp_path: Path) -> None:
    migrated = f"sqlite:///{tmp_path / 'migrated.db'}"
    db._migrate(db.normalize_url(migrated), db.get_engine(migrated))
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    db.upgrade(fresh)  # empty SQLite: created from the models, stamped at head
    assert _columns(fresh) == _columns(migrated)

    def indexes(url: str) -> set[tuple[str, tuple[str, ...]]]:
        inspector = inspect(create_engine(url))
        return {
            (i["name"], tuple(i["column_names"]))
            for t in inspector.get_table_names()
            for i in inspector.get_indexes(t)
        }

    assert indexes(fresh) == indexes(migrated)
    with db.get_engine(fresh).connect() as connection:
        assert db.current_revision(connection) == db.HEAD_REVISION


def test_conversation_documents_are_compressed_with_lz4_on_postgres(pg_database: str) -> None:
    """State, case and result are rewritten often and compressed past ~2 KB: lz4, which
    costs the server several times less CPU than its default, when it has it."""
    db.upgrade(pg_database)
    run_id = steps.new_run_id()
    runs.create_run(pg_database, run_id=run_id, agent=None, input_label="t", options={}, config={})
    long_case = {"id": "C", "input": "hello " * 2000}
    runs.add_cases(pg_database, run_id, [runs.NewCase(0, "C", long_case, None)])
    with db.get_engine(pg_database).connect() as connection:
        available = connection.execute(
            text(
                "SELECT 'lz4' = ANY(enumvals) FROM pg_settings"
                " WHERE name = 'default_toast_compression'"
            )
        ).scalar_one()
        assert available, "this server has no lz4: the migration keeps pglz there"
        methods = dict(
            connection.execute(
                text(
                    "SELECT attname, attcompression FROM pg_attribute"
                    " WHERE attrelid = 'cases'::regclass AND attname IN ('case', 'state', 'result')"
                )
            ).all()
        )
        stored = connection.execute(
            text('SELECT pg_column_compression("case") FROM cases WHERE run_id = :r'),
            {"r": run_id},
        ).scalar_one()
    assert methods == {"case": "l", "state": "l", "result": "l"}
    assert stored == "lz4"
