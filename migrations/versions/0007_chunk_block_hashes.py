"""per-block blake3 of each chunk (verified block by block during transfers)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("data_chunks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("block_hashes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("data_chunks", schema=None) as batch_op:
        batch_op.drop_column("block_hashes")
