"""The /v1 API: API keys, and where a completion came from (key, completion id, the front end's
chat and message ids).

Revision ID: 0002_api_keys
Revises: 0001_baseline
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import op

revision = "0002_api_keys"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", ID, nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("client", sa.String(length=80), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("forwards_user_headers", sa.Boolean(), nullable=False),
        sa.Column("rate_limit", sa.String(length=100), nullable=True),
        sa.Column("created_by", ID, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.Column("request_count", sa.Integer(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("external_chat_id", sa.String(length=200), nullable=True))
        batch.create_index("ix_conversations_external_chat_id", ["external_chat_id"], unique=False)
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("api_key_id", ID, nullable=True))
        batch.add_column(sa.Column("completion_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("external_message_id", sa.String(length=200), nullable=True))
        batch.create_index("ix_messages_api_key_id", ["api_key_id"], unique=False)
        batch.create_index("ix_messages_external_message_id", ["external_message_id"], unique=False)
        batch.create_unique_constraint("uq_messages_completion_id", ["completion_id"])
        batch.create_foreign_key("fk_messages_api_key_id", "api_keys", ["api_key_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    # Drops what the API recorded about completions (which key, completion ids) and the keys;
    # the conversations and messages themselves stay.
    with op.batch_alter_table("messages") as batch:
        batch.drop_constraint("fk_messages_api_key_id", type_="foreignkey")
        batch.drop_constraint("uq_messages_completion_id", type_="unique")
        batch.drop_index("ix_messages_external_message_id")
        batch.drop_index("ix_messages_api_key_id")
        batch.drop_column("external_message_id")
        batch.drop_column("completion_id")
        batch.drop_column("api_key_id")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_index("ix_conversations_external_chat_id")
        batch.drop_column("external_chat_id")
    op.drop_table("api_keys")
