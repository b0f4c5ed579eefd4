"""``training_runs.stage_started_at``, ``stage_done``, ``stage_total``: when the running stage began
and how far it is (its steps done of its total), so the run page can say how long is left.

Revision ID: 0007_run_stage_timing
Revises: 0006_message_finish_reason
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op

revision = "0007_run_stage_timing"
down_revision = "0006_message_finish_reason"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.add_column(sa.Column("stage_started_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("stage_done", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("stage_total", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.drop_column("stage_total")
        batch.drop_column("stage_done")
        batch.drop_column("stage_started_at")
