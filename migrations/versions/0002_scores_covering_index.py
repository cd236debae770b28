"""cover the history queries with the (metric, trace_started_at) index

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 05:40:00.000000

The history queries read scores by metric and time range; carrying app_name, status and value
in the index lets Postgres answer them with index-only scans instead of visiting the wide
score rows (reason, details). SQLite has no INCLUDE columns, so there the index stays as it
was. Building the index locks writes to ``scores`` for the duration of the build.
"""

from __future__ import annotations

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_scores_metric_started', table_name='scores')
    op.create_index(
        'ix_scores_metric_started',
        'scores',
        ['metric', 'trace_started_at'],
        unique=False,
        postgresql_include=['app_name', 'status', 'value'],
    )


def downgrade() -> None:
    op.drop_index('ix_scores_metric_started', table_name='scores')
    op.create_index(
        'ix_scores_metric_started', 'scores', ['metric', 'trace_started_at'], unique=False
    )
