"""Budget reservations: a turn reserves its estimated usage before it calls an agent.

`runs.reserved_tokens`/`reserved_cost` hold what the turns running now reserved,
`runs.budget_turns` how many turns' usage the run's totals hold (their average is the
next turn's estimate); `cases.reserved_tokens`/`reserved_cost` are each conversation's
share, so a turn run again after its worker died replaces its own reservation.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("runs", "reserved_tokens", sa.Integer()),
    ("runs", "reserved_cost", sa.Float()),
    ("runs", "budget_turns", sa.Integer()),
    ("cases", "reserved_tokens", sa.Integer()),
    ("cases", "reserved_cost", sa.Float()),
)


def upgrade() -> None:
    for table, name, kind in _COLUMNS:
        op.add_column(table, sa.Column(name, kind, nullable=False, server_default="0"))


def downgrade() -> None:
    for table, name, _ in reversed(_COLUMNS):
        op.drop_column(table, name)
