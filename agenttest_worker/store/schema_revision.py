"""The schema revision this code reads and writes, named without Alembic or SQLAlchemy.

tests/test_migrations.py checks it against Alembic's head, so that a database already
there is recognized without importing Alembic (a noticeable share of a small run's
start-up), by db.upgrade and by a submitter storing its run through psycopg alone
(postgres_run.py).
"""

HEAD_REVISION = "0011"
