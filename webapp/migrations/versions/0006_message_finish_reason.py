"""``messages.finish_reason``: why an answer's generation ended; ``length`` marks one cut at the
generation limit (shown as cut on the page, left out of training as a complete good answer).

Revision ID: 0006_message_finish_reason
Revises: 0005_message_guidance
Create Date: 2026-11-28
"""
import sqlalchemy as sa
from alembic import op

revision = "0006_message_finish_reason"
down_revision = "0005_message_guidance"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("finish_reason", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("finish_reason")
