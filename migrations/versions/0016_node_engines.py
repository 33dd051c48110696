"""nodes say which serving engines they run (and their versions) and whether they allow remote code; services
and replicas carry a generation (a rolling update starts the next)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engines", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("allow_remote_code", sa.Boolean(), nullable=True))
    for table in ("services", "replicas"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("generation", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    for table in ("replicas", "services"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("generation")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("allow_remote_code")
        batch_op.drop_column("engines")
