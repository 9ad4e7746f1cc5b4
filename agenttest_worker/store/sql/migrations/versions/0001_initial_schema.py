"""Initial schema: runs, cases, turns, assertion results, agent calls, reports.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_calls",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("case_id", sa.String(length=300), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("agent", sa.String(length=200), nullable=False),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "request", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True
        ),
        sa.Column(
            "response", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True
        ),
        sa.PrimaryKeyConstraint("run_id", "case_id", "turn", "position"),
    )
    op.create_table(
        "assertion_results",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("case_id", sa.String(length=300), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "detail", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.PrimaryKeyConstraint("run_id", "case_id", "turn", "position"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("submitted_by", sa.String(length=200), nullable=True),
        sa.Column("agent", sa.String(length=200), nullable=True),
        sa.Column("input_label", sa.Text(), nullable=True),
        sa.Column(
            "options", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column(
            "config", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("parent_run_id", sa.String(length=40), nullable=True),
        sa.Column("total_cases", sa.Integer(), nullable=False),
        sa.Column("finished_cases", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("total_turns", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.Boolean(), nullable=False),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column("deadline_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "turns",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("case_id", sa.String(length=300), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("input", sa.Text(), nullable=True),
        sa.Column("input_source", sa.String(length=16), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column(
            "tool_calls", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("awaiting_input", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("skip_reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("run_id", "case_id", "turn"),
    )
    op.create_table(
        "cases",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("case_id", sa.String(length=300), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("case", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("agent", sa.String(length=200), nullable=True),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("next_turn", sa.Integer(), nullable=False),
        sa.Column("state", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column(
            "result", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True
        ),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "case_id"),
    )
    op.create_index("ix_cases_run_phase", "cases", ["run_id", "phase"], unique=False)
    op.create_index("ix_cases_run_seq", "cases", ["run_id", "seq"], unique=False)
    op.create_table(
        "run_reports",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "format"),
    )


def downgrade() -> None:
    op.drop_table("run_reports")
    op.drop_index("ix_cases_run_seq", table_name="cases")
    op.drop_index("ix_cases_run_phase", table_name="cases")
    op.drop_table("cases")
    op.drop_table("turns")
    op.drop_table("runs")
    op.drop_table("assertion_results")
    op.drop_table("agent_calls")
