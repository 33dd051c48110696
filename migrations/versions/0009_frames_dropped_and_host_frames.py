"""profiler frames a node dropped, and the host frames of a session

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("frames_dropped", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("profiler_sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host_frame_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("profiler_sessions", schema=None) as batch_op:
        batch_op.drop_column("host_frame_count")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("frames_dropped")
