"""models, locations, services and tasks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("model_type", sa.String(length=64), nullable=False),
        sa.Column("source_url", sa.String(length=1024), nullable=True),
        sa.Column("model_size", sa.BigInteger(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("trust_remote_code", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.String(length=2000), nullable=True),
        sa.Column("manifest", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_models_status"), ["status"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=True),
        sa.Column("priority", sa.String(length=16), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=True),
        sa.Column("service_id", sa.String(length=36), nullable=True),
        sa.Column("source_device", sa.String(length=100), nullable=True),
        sa.Column("target_device", sa.String(length=100), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("progress_done_bytes", sa.BigInteger(), nullable=True),
        sa.Column("progress_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_kind"), ["kind"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_model_name"), ["model_name"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_node"), ["node"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_state"), ["state"], unique=False)

    op.create_table(
        "model_locations",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=100), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_locations_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("model_id", "device", name=op.f("pk_model_locations")),
    )
    with op.batch_alter_table("model_locations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_locations_node"), ["node"], unique=False)

    op.create_table(
        "services",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("device", sa.String(length=100), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("url", sa.String(length=300), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.String(length=2000), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=True),
        sa.Column("last_check_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_services_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_services")),
    )
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_services_model_id"), ["model_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_services_node"), ["node"], unique=False)
        batch_op.create_index(batch_op.f("ix_services_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_services_status"))
        batch_op.drop_index(batch_op.f("ix_services_node"))
        batch_op.drop_index(batch_op.f("ix_services_model_id"))

    op.drop_table("services")
    with op.batch_alter_table("model_locations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_locations_node"))

    op.drop_table("model_locations")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_state"))
        batch_op.drop_index(batch_op.f("ix_tasks_node"))
        batch_op.drop_index(batch_op.f("ix_tasks_model_name"))
        batch_op.drop_index(batch_op.f("ix_tasks_kind"))
        batch_op.drop_index(batch_op.f("ix_tasks_created_at"))

    op.drop_table("tasks")
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_models_status"))

    op.drop_table("models")
