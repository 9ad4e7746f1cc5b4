"""Agents' spans, received over OTLP, of the traces of a run's conversations
(models.AgentSpanRow): what trace assertions read and the reports show per turn.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_spans",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=False),
        sa.Column("parent_span_id", sa.String(length=16), nullable=True),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Boolean(), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("turn", sa.Integer(), nullable=True),
        sa.Column("service", sa.String(length=256), nullable=True),
        sa.Column(
            "attributes", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.PrimaryKeyConstraint("run_id", "trace_id", "span_id"),
    )
    op.create_index("ix_agent_spans_trace", "agent_spans", ["trace_id"])


def downgrade() -> None:
    op.drop_index("ix_agent_spans_trace", table_name="agent_spans")
    op.drop_table("agent_spans")
