"""Failed admin sign-ins, per name tried and client address, for the dashboard's overview.

Revision ID: 0004_signin_failures
Revises: 0003_session_generation
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "0004_signin_failures"
down_revision = "0003_session_generation"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "signin_failures",
        sa.Column("id", ID, nullable=False),
        sa.Column("username", sa.String(length=80), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("first_at", sa.DateTime(), nullable=False),
        sa.Column("last_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("username", "address", name="uq_signin_failures_username_address"),
    )
    op.create_index("ix_signin_failures_last_at", "signin_failures", ["last_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_signin_failures_last_at", table_name="signin_failures")
    op.drop_table("signin_failures")
