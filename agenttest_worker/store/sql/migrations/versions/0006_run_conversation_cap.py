"""A run's cap on conversations in flight (--parallel on a fleet), and what it started.

`parallel` is the cap (NULL: none, the fleet's capacity decides). Conversations are
started in submission order (`cases.seq`): the first `started_cases` of them have been
started. The step that ends a conversation moves `started_cases` on in the same
statement that counts the end, and `claimed_from` keeps the value it moved from, so
that statement can say which conversations it claimed to start.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("parallel", sa.Integer(), nullable=True))
    op.add_column(
        "runs", sa.Column("started_cases", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "runs", sa.Column("claimed_from", sa.Integer(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("runs", "claimed_from")
    op.drop_column("runs", "started_cases")
    op.drop_column("runs", "parallel")
