"""profiler frames archived in compressed segments; a stopped session is sealed once its frames and file are whole

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiler_frame_segments",
        sa.Column("session", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("first_ms", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("first_seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("last_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("frames", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "session", "node", "first_ms", "first_seq", name=op.f("pk_profiler_frame_segments")
        ),
    )
    with op.batch_alter_table("profiler_sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("output_file", sa.String(length=1024), nullable=True))
    # Sessions stopped before the archive existed are as whole as they will get: nothing to seal.
    op.execute("UPDATE profiler_sessions SET sealed_at = end_time WHERE state = 'stopped'")


def downgrade() -> None:
    with op.batch_alter_table("profiler_sessions", schema=None) as batch_op:
        batch_op.drop_column("output_file")
        batch_op.drop_column("sealed_at")
    op.drop_table("profiler_frame_segments")
