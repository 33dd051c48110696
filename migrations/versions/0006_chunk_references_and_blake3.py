"""chunk references (pins and workflows) and each chunk's blake3

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("data_chunks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("blake3", sa.String(length=64), nullable=True))

    op.create_table(
        "chunk_refs",
        sa.Column("chunk_id", sa.String(length=36), nullable=False),
        sa.Column("holder", sa.String(length=160), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("workflow_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["chunk_id"],
            ["data_chunks.id"],
            name=op.f("fk_chunk_refs_chunk_id_data_chunks"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflows.id"],
            name=op.f("fk_chunk_refs_workflow_id_workflows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("chunk_id", "holder", name=op.f("pk_chunk_refs")),
    )
    with op.batch_alter_table("chunk_refs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_chunk_refs_workflow_id"), ["workflow_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("chunk_refs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_chunk_refs_workflow_id"))

    op.drop_table("chunk_refs")
    with op.batch_alter_table("data_chunks", schema=None) as batch_op:
        batch_op.drop_column("blake3")
