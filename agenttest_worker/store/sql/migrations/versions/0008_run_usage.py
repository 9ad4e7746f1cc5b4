"""What a run used outside its conversations, by role (`runs.usage`).

Generator agents called while its inputs were expanded, a `--reporter` agent called
after it: {role: {calls, prompt_tokens, completion_tokens, total_tokens, cost}}. NULL
for a run that called none. The conversations' own usage is in their records and in
`agent_calls`.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    kind = sa.JSON().with_variant(JSONB(), "postgresql")
    op.add_column("runs", sa.Column("usage", kind, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "usage")
