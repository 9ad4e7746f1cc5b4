"""The store: where runs, conversations, turns and reports live (SQLite embedded,
Postgres on a fleet), with SQLAlchemy models and Alembic migrations.

Split by subject: `db` (engines, sessions, reconnecting, migrations), `models`
(tables), `repo` (run lifecycle, the hot path, results, recovery), `steps` and
`hot_path` (the rows and compiled statements of a saved step), `buffered` (the embedded
runner's in-memory store, written every half second), `stored_conversations` (reading
conversations back for re-evaluation), `report_copy` (streaming reports with COPY).

Nothing is imported here: SQLAlchemy costs ~0.5 s of start-up that a dry run or the
engine's users never need, so callers import the module they use.
"""
