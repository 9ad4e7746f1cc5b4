"""Run history: each run's suite, and the case a repetition plays.

`runs.suite` names the series of runs a run belongs to (`--suite`, or derived from its
inputs and target), indexed with `created_at` so that a suite's runs are found newest
first. `cases.test_id` is the case id of a repetition of a repeated case (its
`case_id` is the key `ID#N`), NULL when the key is the case id: a case's verdict in a
run gathers the rows whose `coalesce(test_id, case_id)` is its id.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("suite", sa.String(200), nullable=True))
    op.create_index("ix_runs_suite_created", "runs", ["suite", "created_at"])
    op.add_column("cases", sa.Column("test_id", sa.String(300), nullable=True))
    op.create_index("ix_cases_run_test", "cases", ["run_id", "test_id"])


def downgrade() -> None:
    op.drop_index("ix_cases_run_test", table_name="cases")
    op.drop_column("cases", "test_id")
    op.drop_index("ix_runs_suite_created", table_name="runs")
    op.drop_column("runs", "suite")
