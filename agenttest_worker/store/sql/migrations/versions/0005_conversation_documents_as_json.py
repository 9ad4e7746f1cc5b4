"""Keep the conversation's documents as the JSON text written: `json`, not `jsonb`.

A case's state and result are written at every step and only ever read back whole, as
text. jsonb rebuilt each one in its binary form on the server and gave it back with
its object keys reordered (a tool call's arguments, an assertion's fields), so a run
on a fleet reported them in another order than the same run embedded. `json` keeps
the text as sent. Changing a column's type resets its compression, so lz4 (0004) is
set again. Existing rows are rewritten once (the table is locked meanwhile); their
keys stay in the order jsonb had left them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMNS = ("case", "state", "result")


def _retype(kind: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite keeps JSON as text already
    changes = ", ".join(
        f'ALTER COLUMN "{column}" TYPE {kind} USING "{column}"::{kind}' for column in _COLUMNS
    )
    op.execute(f"ALTER TABLE cases {changes}")
    lz4 = op.get_bind().execute(
        sa.text(
            "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'"
            " AND 'lz4' = ANY(enumvals)"
        )
    )
    if lz4.first() is not None:
        compression = ", ".join(
            f'ALTER COLUMN "{column}" SET COMPRESSION lz4' for column in _COLUMNS
        )
        op.execute(f"ALTER TABLE cases {compression}")


def upgrade() -> None:
    _retype("json")


def downgrade() -> None:
    _retype("jsonb")
