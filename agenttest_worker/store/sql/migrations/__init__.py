"""The store's schema migrations, run by Alembic (`db.upgrade`, under a lock).

`env.py` is Alembic's entry point; each revision is a module of `versions/`. A new
embedded (SQLite) database is instead created from the models at the head revision,
without importing Alembic (`db._create_fresh`). Nothing is imported here.
"""
