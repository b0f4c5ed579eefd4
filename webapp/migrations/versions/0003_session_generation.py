"""Revocable sessions: ``users.session_generation`` (bumped by sign-out, a password change and an
admin's sign-out-everywhere), and usernames unique regardless of case.

Revision ID: 0003_session_generation
Revises: 0002_api_keys
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import op

revision = "0003_session_generation"
down_revision = "0002_api_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Checked before any change: names that differ only in case (which the old create-admin could
    # make) cannot share the new index, and which one to rename is the operator's call.
    clashes = op.get_bind().execute(sa.text(
        "SELECT lower(username) FROM users WHERE username IS NOT NULL GROUP BY lower(username) "
        "HAVING COUNT(*) > 1")).scalars().all()
    if clashes:
        raise RuntimeError(f"usernames that differ only in case: {', '.join(sorted(clashes)[:5])}. Rename all but "
                           "one of each (UPDATE users SET username = ... WHERE id = ...), then upgrade again")
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("session_generation", sa.Integer(), server_default="0", nullable=False))
    op.create_index("uq_users_username_lower", "users", [sa.text("lower(username)")], unique=True)


def downgrade() -> None:
    op.drop_index("uq_users_username_lower", table_name="users")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("session_generation")
