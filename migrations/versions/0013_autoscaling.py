"""autoscaling: a service's policy, the preset each replica runs, and the scaling decisions

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.add_column(sa.Column("autoscaling", sa.JSON(), nullable=True))
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("draining_since", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "scaling_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("service_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_replicas", sa.Integer(), nullable=False),
        sa.Column("to_replicas", sa.Integer(), nullable=False),
        sa.Column("direction", sa.String(length=8), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("load", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["service_id"],
            ["services.id"],
            name=op.f("fk_scaling_events_service_id_services"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scaling_events")),
    )
    with op.batch_alter_table("scaling_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scaling_events_service_id"), ["service_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("scaling_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scaling_events_service_id"))
    op.drop_table("scaling_events")
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_column("draining_since")
        batch_op.drop_column("engine")
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.drop_column("autoscaling")
