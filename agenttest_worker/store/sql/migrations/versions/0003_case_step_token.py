"""A token per saved step, so that a retried write can recognize its own commit.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cases", sa.Column("step_token", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column("cases", "step_token")
