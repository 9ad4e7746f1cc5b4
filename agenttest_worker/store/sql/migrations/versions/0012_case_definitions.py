"""A case's definition as hashes, stored with each conversation.

Run history compared a case's verdicts across runs whatever became of the case in
between, and a regression's assertions position by position. Each conversation now
keeps the hash of its case's normalized record and of each of its assertions
(agenttest_worker/case_definitions.py): a case whose hash differs from the baseline's
is `changed`, and assertions are matched by their hashes. Conversations stored before
have none, and compare as they did.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(JSONB(), "postgresql")
    op.add_column("cases", sa.Column("definition_hash", sa.String(40), nullable=True))
    op.add_column("cases", sa.Column("assertion_hashes", json_type, nullable=True))


def downgrade() -> None:
    op.drop_column("cases", "assertion_hashes")
    op.drop_column("cases", "definition_hash")
