"""The store: where runs, conversations, turns and reports live (SQLite embedded,
Postgres on a fleet), with SQLAlchemy models and Alembic migrations.

Split by subject:

- `base`: `ConversationStore`, all a conversation step needs from storage, and
  `SqlStore`, which goes to the database on every step (workers);
- `buffered`: `BufferedStore`, the embedded runner's store, in memory and written every
  half second;
- `steps`: what a step loads and saves (`LoadedCase`, `Step`, `Saved`) and its rows, as
  plain data without SQLAlchemy;
- `runs`: a run's lifecycle (created, its cases stored, started, cancelled, removed);
- `turns`: the hot path, loading a conversation and saving a step exactly once, with
  its statements, as SQL text, in `turn_statements`;
- `results`: claiming the aggregation, storing reports, reading records back;
- `recovery`: what the sweeper asks (stalled and abandoned runs, lost aggregations);
- `stored_conversations`: reading conversations back for re-evaluation;
- `db` (engines, sessions, reconnecting, migrations), `models` (tables), `_sql` (what
  the query modules share), `storable` (JSON without NUL), `report_copy` (streaming
  reports with COPY).

Nothing is imported here: SQLAlchemy costs ~0.5 s of start-up that a dry run or the
engine's users never need, so callers import the module they use.
"""
