"""The baseline a team chose: promoted runs, and runs that failed their gate.

`--baseline suite` took the suite's previous finished run, whatever it was: a failing
pull-request job re-run compared with its own failed run and passed, and concurrent
pull requests compared with each other's. `promote RUN` now stamps a run as its
suite's baseline (`promoted_at`), and a gated run (--fail-on) keeps its outcome
(`gate`), so that a run that failed its gate is never taken as a baseline.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("gate", sa.String(8), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "gate")
    op.drop_column("runs", "promoted_at")
