"""Judge audits and people's labels of judged verdicts.

`label RUN CASE TURN pass|fail` (and the viewer) keep a person's verdict on one judged
assertion beside the judge's (`judge_labels`); `audit-judges RUN` keeps what it found
(`judge_audits`), so that what reads a run later knows which criteria were unstable.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judge_labels",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("case_id", sa.String(length=300), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("criterion", sa.Text(), nullable=False),
        sa.Column("judge_verdict", sa.Boolean(), nullable=False),
        sa.Column("label", sa.Boolean(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("labelled_by", sa.String(length=200), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_judge_labels_run_id", "judge_labels", ["run_id"])
    op.create_table(
        "judge_audits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("times", sa.Integer(), nullable=False),
        sa.Column(
            "result", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_judge_audits_run_id", "judge_audits", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_judge_audits_run_id", table_name="judge_audits")
    op.drop_table("judge_audits")
    op.drop_index("ix_judge_labels_run_id", table_name="judge_labels")
    op.drop_table("judge_labels")
