"""summary rows of complete buckets

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 06:20:00.000000

Long history windows read cached summary rows of complete buckets instead of every score;
writers of scores remove the rows of the buckets they touch.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "summary_cache",
        sa.Column("bucket", sa.String(length=8), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("app_name", sa.String(length=200), nullable=False),
        sa.Column("n_scored", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("p10", sa.Float(), nullable=True),
        sa.Column("p50", sa.Float(), nullable=True),
        sa.Column("p90", sa.Float(), nullable=True),
        sa.Column("n_skipped", sa.Integer(), nullable=False),
        sa.Column("n_failed", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("bucket", "bucket_start", "metric", "app_name"),
    )


def downgrade() -> None:
    op.drop_table("summary_cache")
