"""Compress the conversation's documents with lz4 where the server has it.

A conversation's state is rewritten at every step, and past ~2 KB Postgres compresses
it: with its default (pglz) that was a visible share of the server's CPU per turn in
long conversations (benchmarks/throughput.py --turns 20 --reply-chars 1000). lz4
compresses several times faster. Only values written from now on change; a server
built without lz4 keeps pglz. SQLite has no such setting.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLUMNS = ("case", "state", "result")


def _has_lz4() -> bool:
    found = op.get_bind().execute(
        sa.text(
            "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'"
            " AND 'lz4' = ANY(enumvals)"
        )
    )
    return found.first() is not None


def _set_compression(method: str) -> None:
    if op.get_bind().dialect.name != "postgresql" or not _has_lz4():
        return
    for column in _COLUMNS:
        op.execute(f'ALTER TABLE cases ALTER COLUMN "{column}" SET COMPRESSION {method}')


def upgrade() -> None:
    _set_compression("lz4")


def downgrade() -> None:
    _set_compression("pglz")
