"""``messages.guidance``: the instruction of a guided regeneration (Open WebUI's "More Concise", "Add
Details" or a typed change), kept on the sibling answer it asked for.

Revision ID: 0005_message_guidance
Revises: 0004_signin_failures
Create Date: 2026-11-28
"""
import sqlalchemy as sa
from alembic import op

revision = "0005_message_guidance"
down_revision = "0004_signin_failures"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("guidance", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("guidance")
