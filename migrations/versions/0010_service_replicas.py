"""services become groups of replicas: each old service row keeps its id and becomes one replica of itself

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

MOVED = ("node", "url", "pid", "healthy", "last_check_at", "started_at")


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("service_id", sa.String(length=36), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("device", sa.String(length=100), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("url", sa.String(length=300), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.String(length=2000), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=True),
        sa.Column("task_id", sa.String(length=36), nullable=True),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("last_check_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["service_id"], ["services.id"], name=op.f("fk_replicas_service_id_services"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
    )
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_replicas_node"), ["node"], unique=False)
        batch_op.create_index(batch_op.f("ix_replicas_service_id"), ["service_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_replicas_status"), ["status"], unique=False)
    op.execute(
        "INSERT INTO replicas (id, service_id, node, device, port, url, pid, status, status_message, healthy, "
        "last_check_at, started_at, stopped_at, created_at) SELECT id, id, node, device, port, url, pid, status, "
        "status_message, healthy, last_check_at, started_at, stopped_at, created_at FROM services"
    )
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_services_node"))
        for column in MOVED:
            batch_op.drop_column(column)
        batch_op.add_column(sa.Column("replicas", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("idle_timeout_s", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("cold_start_timeout_s", sa.Float(), nullable=False, server_default="120")
        )


def downgrade() -> None:
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.drop_column("cold_start_timeout_s")
        batch_op.drop_column("idle_timeout_s")
        batch_op.drop_column("replicas")
        batch_op.add_column(sa.Column("node", sa.String(length=63), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("url", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("healthy", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("last_check_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_services_node"), ["node"], unique=False)
    op.execute(
        "UPDATE services SET node = (SELECT r.node FROM replicas r WHERE r.service_id = services.id "
        "ORDER BY r.created_at LIMIT 1)"
    )
    op.drop_table("replicas")
