"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 05:17:49.759578
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Stored JSON is JSONB on Postgres; ids are BIGINT there and INTEGER (rowid) on SQLite.
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('traces',
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('app_name', sa.String(length=200), nullable=False),
    sa.Column('service_name', sa.String(length=200), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('duration_ms', sa.Float(), nullable=False),
    sa.Column('user_input', sa.Text(), nullable=True),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('reference', sa.Text(), nullable=True),
    sa.Column('reference_contexts', JSON_TYPE, nullable=True),
    sa.Column('reference_context_ids', JSON_TYPE, nullable=True),
    sa.Column('metadata', JSON_TYPE, nullable=False),
    sa.Column('error', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('notes', JSON_TYPE, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('trace_id')
    )
    op.create_index('ix_traces_app_started_at', 'traces', ['app_name', 'started_at'], unique=False)
    op.create_index('ix_traces_started_at', 'traces', ['started_at'], unique=False)
    op.create_table('retrieved_contexts',
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('context_id', sa.String(length=500), nullable=True),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('metadata', JSON_TYPE, nullable=False),
    sa.ForeignKeyConstraint(['trace_id'], ['traces.trace_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('trace_id', 'position')
    )
    op.create_table('scores',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=32), nullable=False),
    sa.Column('app_name', sa.String(length=200), nullable=False),
    sa.Column('trace_started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('details', JSON_TYPE, nullable=False),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=True),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('cost_usd', sa.Float(), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('scored_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['trace_id'], ['traces.trace_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trace_id', 'metric', 'version', name='uq_scores_trace_metric_version')
    )
    op.create_index('ix_scores_app_metric_started', 'scores', ['app_name', 'metric', 'trace_started_at'], unique=False)
    op.create_index('ix_scores_metric_started', 'scores', ['metric', 'trace_started_at'], unique=False)
    op.create_index('ix_scores_metric_value', 'scores', ['metric', 'value'], unique=False, postgresql_where=sa.text("status = 'scored'"), sqlite_where=sa.text("status = 'scored'"))
    op.create_table('scoring_jobs',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('run_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('first_transient_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('locked_by', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['trace_id'], ['traces.trace_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trace_id', 'metric', 'version', name='uq_scoring_jobs_trace_metric')
    )
    op.create_index('ix_scoring_jobs_due', 'scoring_jobs', ['run_at', 'id'], unique=False, postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))
    op.create_index('ix_scoring_jobs_failed', 'scoring_jobs', ['updated_at'], unique=False, postgresql_where=sa.text("status = 'failed'"), sqlite_where=sa.text("status = 'failed'"))
    op.create_index('ix_scoring_jobs_leases', 'scoring_jobs', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
    op.create_index('ix_scoring_jobs_waiting', 'scoring_jobs', ['expires_at'], unique=False, postgresql_where=sa.text("status = 'waiting'"), sqlite_where=sa.text("status = 'waiting'"))


def downgrade() -> None:
    op.drop_index('ix_scoring_jobs_waiting', table_name='scoring_jobs', postgresql_where=sa.text("status = 'waiting'"), sqlite_where=sa.text("status = 'waiting'"))
    op.drop_index('ix_scoring_jobs_leases', table_name='scoring_jobs', postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
    op.drop_index('ix_scoring_jobs_failed', table_name='scoring_jobs', postgresql_where=sa.text("status = 'failed'"), sqlite_where=sa.text("status = 'failed'"))
    op.drop_index('ix_scoring_jobs_due', table_name='scoring_jobs', postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))
    op.drop_table('scoring_jobs')
    op.drop_index('ix_scores_metric_value', table_name='scores', postgresql_where=sa.text("status = 'scored'"), sqlite_where=sa.text("status = 'scored'"))
    op.drop_index('ix_scores_metric_started', table_name='scores')
    op.drop_index('ix_scores_app_metric_started', table_name='scores')
    op.drop_table('scores')
    op.drop_table('retrieved_contexts')
    op.drop_index('ix_traces_started_at', table_name='traces')
    op.drop_index('ix_traces_app_started_at', table_name='traces')
    op.drop_table('traces')
