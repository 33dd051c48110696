"""profiler sessions

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiler_sessions",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("freq_ms", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("enable_bandwidth", sa.Boolean(), nullable=False),
        sa.Column("enable_nvlink", sa.Boolean(), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("frame_count", sa.Integer(), nullable=True),
        sa.Column("summary_by_device", sa.JSON(), nullable=True),
        sa.Column("summary_by_node", sa.JSON(), nullable=True),
        sa.Column("request_time_info", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_profiler_sessions")),
    )
    with op.batch_alter_table("profiler_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_profiler_sessions_state"), ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("profiler_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_profiler_sessions_state"))

    op.drop_table("profiler_sessions")
