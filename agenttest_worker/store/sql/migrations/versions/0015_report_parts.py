"""A run's reports stored in parts (models.RunReportRow: run_id, format, part).

A report was one row: a million-case run's JSONL and console reports were each joined
into one string of hundreds of megabytes to be stored, and read back whole to be
printed. Stored in parts of about a megabyte, a report is written as it is rendered and
read back a part at a time. Each report stored so far becomes its part 0.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_report_parts",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "format", "part"),
    )
    op.execute(
        "INSERT INTO run_report_parts (run_id, format, part, content, created_at)"
        " SELECT run_id, format, 0, content, created_at FROM run_reports"
    )
    op.drop_table("run_reports")
    op.rename_table("run_report_parts", "run_reports")


def downgrade() -> None:
    op.create_table(
        "run_reports_whole",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "format"),
    )
    # Joined in their order: SQLite's group_concat keeps the order the rows come in.
    op.execute(
        "INSERT INTO run_reports_whole (run_id, format, content, created_at)"
        " SELECT run_id, format, "
        + (
            "string_agg(content, '' ORDER BY part)"
            if op.get_bind().dialect.name == "postgresql"
            else "group_concat(content, '')"
        )
        + ", min(created_at) FROM (SELECT * FROM run_reports ORDER BY run_id, format, part)"
        " AS ordered GROUP BY run_id, format"
    )
    op.drop_table("run_reports")
    op.rename_table("run_reports_whole", "run_reports")
