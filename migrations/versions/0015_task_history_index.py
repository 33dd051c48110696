"""the queue's estimates: indexes for a node's (and the fleet's) latest finished operations

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tasks_node_state_finished", "tasks", ["node", "state", "finished_at"])
    op.create_index("ix_tasks_state_finished", "tasks", ["state", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_tasks_state_finished", table_name="tasks")
    op.drop_index("ix_tasks_node_state_finished", table_name="tasks")
