"""Baseline: the schema as ``db.create_all()`` made it before migrations.

A database from that time has these tables and no revision. Upgrading it runs this revision,
which creates only the tables it lacks (an older database may predate some of them) and never
touches an existing table or row; from here on every schema change is a revision of its own.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None

TABLES = ['audit_events', 'model_versions', 'users', 'conversations', 'experiments', 'identity_origins', 'rail_rules',
          'rater_trust', 'training_runs', 'assignments', 'messages', 'rater_assessments', 'answer_scores',
          'comparisons', 'feedback', 'flags', 'rail_interventions']


def upgrade() -> None:
    bind = op.get_bind()
    existing = set(sa.inspect(bind).get_table_names())
    if "audit_events" not in existing:
        op.create_table('audit_events',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('actor', sa.String(length=80), nullable=False),
            sa.Column('action', sa.String(length=40), nullable=False),
            sa.Column('subject', sa.String(length=200), nullable=False),
            sa.Column('detail', sa.JSON(), nullable=False),
            sa.PrimaryKeyConstraint('id')
        )
        op.create_index(op.f('ix_audit_events_created_at'), 'audit_events', ['created_at'], unique=False)
    if "model_versions" not in existing:
        op.create_table('model_versions',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('name', sa.String(length=120), nullable=False),
            sa.Column('path', sa.String(length=1000), nullable=False),
            sa.Column('parent_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('kind', sa.String(length=32), nullable=False),
            sa.Column('status', sa.String(length=16), nullable=False),
            sa.Column('training_run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('metrics', sa.JSON(), nullable=False),
            sa.Column('config', sa.JSON(), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("status IN ('candidate', 'active', 'retired', 'failed')",
                               name='ck_model_versions_status'),
            sa.ForeignKeyConstraint(['parent_id'], ['model_versions.id'], ),
            sa.ForeignKeyConstraint(['training_run_id'], ['training_runs.id'],
                                    name='model_versions_training_run_id_fkey', use_alter=True),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('name')
        )
        op.create_index(op.f('ix_model_versions_status'), 'model_versions', ['status'], unique=False)
    if "users" not in existing:
        op.create_table('users',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('anon_id', sa.String(length=64), nullable=True),
            sa.Column('username', sa.String(length=80), nullable=True),
            sa.Column('password_hash', sa.String(length=255), nullable=True),
            sa.Column('is_admin', sa.Boolean(), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('anon_id'),
            sa.UniqueConstraint('username')
        )
    if "conversations" not in existing:
        op.create_table('conversations',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('title', sa.String(length=200), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('updated_at', sa.DateTime(), nullable=False),
            sa.Column('deleted_at', sa.DateTime(), nullable=True),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id')
        )
        op.create_index('ix_conversations_user_created', 'conversations', ['user_id', 'created_at'], unique=False)
        op.create_index(op.f('ix_conversations_user_id'), 'conversations', ['user_id'], unique=False)
    if "experiments" not in existing:
        op.create_table('experiments',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('key', sa.String(length=120), nullable=False),
            sa.Column('control_version_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('variant_version_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('traffic_split', sa.Float(), nullable=False),
            sa.Column('status', sa.String(length=16), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('started_at', sa.DateTime(), nullable=True),
            sa.Column('ended_at', sa.DateTime(), nullable=True),
            sa.Column('decision', sa.String(length=32), nullable=True),
            sa.Column('decision_detail', sa.JSON(), nullable=False),
            sa.CheckConstraint("status IN ('draft', 'running', 'stopped', 'concluded')", name='ck_experiments_status'),
            sa.CheckConstraint('traffic_split > 0 AND traffic_split < 1', name='ck_experiments_split'),
            sa.ForeignKeyConstraint(['control_version_id'], ['model_versions.id'], ),
            sa.ForeignKeyConstraint(['variant_version_id'], ['model_versions.id'], ),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('key')
        )
        op.create_index(op.f('ix_experiments_status'), 'experiments', ['status'], unique=False)
    if "identity_origins" not in existing:
        op.create_table('identity_origins',
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('address_hash', sa.String(length=64), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('user_id')
        )
        op.create_index('ix_identity_origins_address_created', 'identity_origins', ['address_hash', 'created_at'],
                        unique=False)
    if "rail_rules" not in existing:
        op.create_table('rail_rules',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('kind', sa.String(length=16), nullable=False),
            sa.Column('value', sa.String(length=400), nullable=False),
            sa.Column('enabled', sa.Boolean(), nullable=False),
            sa.Column('created_by', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("kind IN ('phrase', 'pattern', 'preset')", name='ck_rail_rules_kind'),
            sa.ForeignKeyConstraint(['created_by'], ['users.id'], ondelete='SET NULL'),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('kind', 'value', name='uq_rail_rules_kind_value')
        )
    if "rater_trust" not in existing:
        op.create_table('rater_trust',
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('trust', sa.String(length=16), nullable=False),
            sa.Column('note', sa.Text(), nullable=True),
            sa.Column('set_by', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('set_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("trust IN ('auto', 'trusted', 'quarantined')", name='ck_rater_trust_trust'),
            sa.ForeignKeyConstraint(['set_by'], ['users.id'], ondelete='SET NULL'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('user_id')
        )
    if "training_runs" not in existing:
        op.create_table('training_runs',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('trigger', sa.String(length=16), nullable=False),
            sa.Column('algorithm', sa.String(length=16), nullable=False),
            sa.Column('status', sa.String(length=16), nullable=False),
            sa.Column('stage', sa.String(length=32), nullable=True),
            sa.Column('progress', sa.Float(), nullable=False),
            sa.Column('feedback_counts', sa.JSON(), nullable=False),
            sa.Column('metrics', sa.JSON(), nullable=False),
            sa.Column('config', sa.JSON(), nullable=False),
            sa.Column('log', sa.Text(), nullable=False),
            sa.Column('error', sa.Text(), nullable=True),
            sa.Column('pid', sa.Integer(), nullable=True),
            sa.Column('hostname', sa.String(length=255), nullable=True),
            sa.Column('heartbeat_at', sa.DateTime(), nullable=True),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('started_at', sa.DateTime(), nullable=True),
            sa.Column('finished_at', sa.DateTime(), nullable=True),
            sa.Column('version_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')",
                               name='ck_training_runs_status'),
            sa.ForeignKeyConstraint(['version_id'], ['model_versions.id'], ),
            sa.PrimaryKeyConstraint('id')
        )
        op.create_index(op.f('ix_training_runs_status'), 'training_runs', ['status'], unique=False)
    if "assignments" not in existing:
        op.create_table('assignments',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('experiment_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('arm', sa.String(length=16), nullable=False),
            sa.Column('first_seen', sa.DateTime(), nullable=False),
            sa.CheckConstraint("arm IN ('control', 'variant')", name='ck_assignments_arm'),
            sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('experiment_id', 'user_id', name='uq_assignments_experiment_user')
        )
        op.create_index(op.f('ix_assignments_experiment_id'), 'assignments', ['experiment_id'], unique=False)
        op.create_index(op.f('ix_assignments_user_id'), 'assignments', ['user_id'], unique=False)
    if "messages" not in existing:
        op.create_table('messages',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('conversation_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('role', sa.String(length=16), nullable=False),
            sa.Column('content', sa.Text(), nullable=False),
            sa.Column('parent_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('model_version_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('experiment_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('arm', sa.String(length=16), nullable=True),
            sa.Column('latency_ms', sa.Float(), nullable=True),
            sa.Column('token_count', sa.Integer(), nullable=True),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("arm IS NULL OR arm IN ('control', 'variant')", name='ck_messages_arm'),
            sa.CheckConstraint("role IN ('user', 'assistant', 'system')", name='ck_messages_role'),
            sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ),
            sa.ForeignKeyConstraint(['model_version_id'], ['model_versions.id'], ),
            sa.ForeignKeyConstraint(['parent_id'], ['messages.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id')
        )
        op.create_index(op.f('ix_messages_conversation_id'), 'messages', ['conversation_id'], unique=False)
        op.create_index(op.f('ix_messages_experiment_id'), 'messages', ['experiment_id'], unique=False)
        op.create_index(op.f('ix_messages_model_version_id'), 'messages', ['model_version_id'], unique=False)
        op.create_index(op.f('ix_messages_parent_id'), 'messages', ['parent_id'], unique=False)
    if "rater_assessments" not in existing:
        op.create_table('rater_assessments',
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('training_run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('events', sa.Integer(), nullable=False),
            sa.Column('raw_share', sa.Float(), nullable=False),
            sa.Column('share', sa.Float(), nullable=False),
            sa.Column('agreement', sa.Float(), nullable=True),
            sa.Column('checked', sa.Integer(), nullable=False),
            sa.Column('weight', sa.Float(), nullable=False),
            sa.Column('status', sa.String(length=16), nullable=False),
            sa.Column('reasons', sa.JSON(), nullable=False),
            sa.Column('assessed_at', sa.DateTime(), nullable=False),
            sa.ForeignKeyConstraint(['training_run_id'], ['training_runs.id'], ondelete='SET NULL'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('user_id')
        )
        op.create_index(op.f('ix_rater_assessments_status'), 'rater_assessments', ['status'], unique=False)
        op.create_index(op.f('ix_rater_assessments_training_run_id'), 'rater_assessments', ['training_run_id'],
                        unique=False)
    if "answer_scores" not in existing:
        op.create_table('answer_scores',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('reward_model', sa.String(length=1000), nullable=False),
            sa.Column('score', sa.Float(), nullable=False),
            sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('message_id', 'reward_model', name='uq_answer_scores_message_model')
        )
        op.create_index(op.f('ix_answer_scores_message_id'), 'answer_scores', ['message_id'], unique=False)
    if "comparisons" not in existing:
        op.create_table('comparisons',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('prompt_message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('message_a_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('message_b_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('winner', sa.String(length=16), nullable=True),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('voted_at', sa.DateTime(), nullable=True),
            sa.CheckConstraint("winner IS NULL OR winner IN ('a', 'b', 'tie', 'both_bad')",
                               name='ck_comparisons_winner'),
            sa.ForeignKeyConstraint(['message_a_id'], ['messages.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['message_b_id'], ['messages.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['prompt_message_id'], ['messages.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id')
        )
        op.create_index(op.f('ix_comparisons_prompt_message_id'), 'comparisons', ['prompt_message_id'], unique=False)
        op.create_index(op.f('ix_comparisons_user_id'), 'comparisons', ['user_id'], unique=False)
    if "feedback" not in existing:
        op.create_table('feedback',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('thumb', sa.String(length=8), nullable=True),
            sa.Column('rating', sa.Integer(), nullable=True),
            sa.Column('correction', sa.Text(), nullable=True),
            sa.Column('comment', sa.Text(), nullable=True),
            sa.Column('reasons', sa.JSON(), nullable=False),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('updated_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("thumb IS NULL OR thumb IN ('up', 'down')", name='ck_feedback_thumb'),
            sa.CheckConstraint('rating IS NULL OR (rating BETWEEN 1 AND 5)', name='ck_feedback_rating'),
            sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('user_id', 'message_id', name='uq_feedback_user_message')
        )
        op.create_index(op.f('ix_feedback_message_id'), 'feedback', ['message_id'], unique=False)
        op.create_index(op.f('ix_feedback_updated_at'), 'feedback', ['updated_at'], unique=False)
        op.create_index(op.f('ix_feedback_user_id'), 'feedback', ['user_id'], unique=False)
    if "flags" not in existing:
        op.create_table('flags',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('category', sa.String(length=32), nullable=False),
            sa.Column('note', sa.Text(), nullable=True),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.Column('updated_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("category IN ('harassment', 'hate', 'self_harm', 'sexual', 'violence', 'dangerous', "
                               "'personal_data', 'other')", name='ck_flags_category'),
            sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ondelete='CASCADE'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
            sa.PrimaryKeyConstraint('id'),
            sa.UniqueConstraint('user_id', 'message_id', name='uq_flags_user_message')
        )
        op.create_index(op.f('ix_flags_message_id'), 'flags', ['message_id'], unique=False)
        op.create_index(op.f('ix_flags_updated_at'), 'flags', ['updated_at'], unique=False)
        op.create_index(op.f('ix_flags_user_id'), 'flags', ['user_id'], unique=False)
    if "rail_interventions" not in existing:
        op.create_table('rail_interventions',
            sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
            sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('conversation_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('reason', sa.String(length=500), nullable=False),
            sa.Column('kind', sa.String(length=16), nullable=False),
            sa.Column('action', sa.String(length=16), nullable=False),
            sa.Column('attempt', sa.Integer(), nullable=False),
            sa.Column('blocked_text', sa.Text(), nullable=False),
            sa.Column('model_version_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
            sa.Column('created_at', sa.DateTime(), nullable=False),
            sa.CheckConstraint("action IN ('refused', 'regenerated')", name='ck_rail_interventions_action'),
            sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], ondelete='SET NULL'),
            sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ondelete='SET NULL'),
            sa.ForeignKeyConstraint(['model_version_id'], ['model_versions.id'], ondelete='SET NULL'),
            sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='SET NULL'),
            sa.PrimaryKeyConstraint('id')
        )
        op.create_index(op.f('ix_rail_interventions_created_at'), 'rail_interventions', ['created_at'], unique=False)
        op.create_index(op.f('ix_rail_interventions_message_id'), 'rail_interventions', ['message_id'], unique=False)
        op.create_index(op.f('ix_rail_interventions_user_id'), 'rail_interventions', ['user_id'], unique=False)
    if bind.dialect.name != "sqlite" and "model_versions" not in existing:
        # the cycle model_versions <-> training_runs: created by ALTER once both tables exist
        # (SQLite keeps it inline, where it was declared)
        op.create_foreign_key("model_versions_training_run_id_fkey", "model_versions", "training_runs",
                              ["training_run_id"], ["id"])


def downgrade() -> None:
    # Dropping the baseline would delete every row: refused. Restore a backup instead.
    raise RuntimeError("the baseline revision cannot be downgraded (it would drop every table and its rows)")
