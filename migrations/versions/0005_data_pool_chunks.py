"""data pool chunks

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "data_chunks",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("checksum", sa.String(length=64), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("chunk_type", sa.String(length=16), nullable=False),
        sa.Column("format", sa.String(length=32), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.String(length=2000), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_accessed", sa.DateTime(timezone=True), nullable=True),
        sa.Column("access_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_data_chunks")),
    )
    with op.batch_alter_table("data_chunks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_data_chunks_checksum"), ["checksum"], unique=False)

    op.create_table(
        "chunk_locations",
        sa.Column("chunk_id", sa.String(length=36), nullable=False),
        sa.Column("device", sa.String(length=100), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["chunk_id"],
            ["data_chunks.id"],
            name=op.f("fk_chunk_locations_chunk_id_data_chunks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("chunk_id", "device", name=op.f("pk_chunk_locations")),
    )
    with op.batch_alter_table("chunk_locations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_chunk_locations_node"), ["node"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("chunk_locations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_chunk_locations_node"))

    op.drop_table("chunk_locations")
    with op.batch_alter_table("data_chunks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_data_chunks_checksum"))

    op.drop_table("data_chunks")
