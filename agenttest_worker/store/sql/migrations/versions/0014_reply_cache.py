"""Agents' replies kept to be served again (models.ReplyCacheRow).

A judge, simulator or generator asked the same thing twice, run after run, is called
once: its reply is kept by the sha256 of what determines it, until it expires or the
table's bound evicts it. A row without a reply is a caller's lease on calling for it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reply_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("reply", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_reply_cache_created_at", "reply_cache", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_reply_cache_created_at", table_name="reply_cache")
    op.drop_table("reply_cache")
