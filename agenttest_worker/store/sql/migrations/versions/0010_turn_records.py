"""A running conversation's earlier turns' results, one row each (models.TurnRecordRow).

A step used to rewrite the conversation's whole state, every earlier turn's result
included, so that a turn's cost grew with the conversation. Now the state a step
stores holds only the turns after its first `earlier_turns`, whose results are rows
here (benchmarks/long_conversation.py). Conversations stored before keep their whole
state, and are played on that way.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "turn_records",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("case_id", sa.String(length=300), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id", "case_id"], ["cases.run_id", "cases.case_id"], ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "case_id", "position"),
    )


def downgrade() -> None:
    op.drop_table("turn_records")
