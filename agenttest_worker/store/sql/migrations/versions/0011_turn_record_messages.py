"""A running conversation's earlier messages, stored with its turn records.

A step stored its conversation's whole message history in the state every turn: at
turn 50 of replies of 1,000 characters, ~50 KB that Postgres checked, compressed and
logged again at each step (benchmarks/long_conversation.py). Now the messages that left
the state are stored once, with the turn record they left with (`messages`: the inside
of a JSON array), and the state holds those after its first `earlier_messages`.
Conversations stored before keep every message in their state, and are played on that
way until their next step moves them here.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turn_records", sa.Column("messages", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("turn_records", "messages")
