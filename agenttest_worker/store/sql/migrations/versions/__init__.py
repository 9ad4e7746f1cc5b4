"""The schema's revisions, one module each, applied in order;
`db.HEAD_REVISION` names the newest (tests/test_migrations.py checks it
against Alembic's head)."""
