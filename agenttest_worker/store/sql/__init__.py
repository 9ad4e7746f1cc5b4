"""The store's database side: tables, migrations, and the statements each subject runs.

SQLite for an embedded run, PostgreSQL on a fleet, through SQLAlchemy 2 (and psycopg
for a turn's own statements). One module per subject: `runs` (a run's lifecycle),
`turns` and `turn_statements` (loading and saving a step exactly once), `results`,
`recovery`, `run_history`, `usage`, `budget`, `stored_conversations`, `report_copy`;
`db` (engines, sessions, reconnecting, migrations), `models` (tables), `shared` (what
the query modules share). Nothing is imported here: callers go through the store's
face (`agenttest_worker.store`).
"""
