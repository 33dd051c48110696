"""workflows and workflow steps

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workflows",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.String(length=2000), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("fail_fast", sa.Boolean(), nullable=False),
        sa.Column("queue_config", sa.JSON(), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workflows")),
    )
    with op.batch_alter_table("workflows", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workflows_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_workflows_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_workflows_status"), ["status"], unique=False)

    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("workflow_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("step_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("depends_on", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("segment", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("position", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("device", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("exclusive", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("outputs", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("dispatched", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.create_index(batch_op.f("ix_tasks_workflow_id"), ["workflow_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_tasks_workflow_id_workflows"),
            "workflows",
            ["workflow_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_tasks_workflow_id_workflows"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_tasks_workflow_id"))
        batch_op.drop_column("dispatched")
        batch_op.drop_column("outputs")
        batch_op.drop_column("exclusive")
        batch_op.drop_column("device")
        batch_op.drop_column("position")
        batch_op.drop_column("segment")
        batch_op.drop_column("depends_on")
        batch_op.drop_column("step_id")
        batch_op.drop_column("workflow_id")

    with op.batch_alter_table("workflows", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workflows_status"))
        batch_op.drop_index(batch_op.f("ix_workflows_name"))
        batch_op.drop_index(batch_op.f("ix_workflows_created_at"))

    op.drop_table("workflows")
