"""chunks listed newest first without sorting the pool

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_data_chunks_created_at", "data_chunks", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_data_chunks_created_at", table_name="data_chunks")
