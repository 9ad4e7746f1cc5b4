"""Run cost (for --max-cost) and an index for the stall sweeper.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_cases_run_updated", "cases", ["run_id", "updated_at"], unique=False)
    op.add_column("runs", sa.Column("total_cost", sa.Float(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("runs", "total_cost")
    op.drop_index("ix_cases_run_updated", table_name="cases")
