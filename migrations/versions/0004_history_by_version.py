"""history reads one version of each metric

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 22:15:00.000000

After a variant's version changes, a backfill stores the new version's scores beside the old
ones; the history queries then read one version per metric. The score indexes gain the version
after the metric, so those reads stay range scans (index-only on Postgres), and the summary
cache is keyed by version too. The cache holds nothing that cannot be recomputed, so it is
rebuilt empty. Building the indexes locks writes to ``scores`` for the duration of the build.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _summary_cache(*, with_version: bool) -> None:
    key = ["bucket", "bucket_start", "metric", *(["version"] if with_version else []), "app_name"]
    op.create_table(
        "summary_cache",
        sa.Column("bucket", sa.String(length=8), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        *([sa.Column("version", sa.String(length=32), nullable=False)] if with_version else []),
        sa.Column("app_name", sa.String(length=200), nullable=False),
        sa.Column("n_scored", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("p10", sa.Float(), nullable=True),
        sa.Column("p50", sa.Float(), nullable=True),
        sa.Column("p90", sa.Float(), nullable=True),
        sa.Column("n_skipped", sa.Integer(), nullable=False),
        sa.Column("n_failed", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*key),
    )


def _score_indexes(*, with_version: bool) -> None:
    """The three history indexes on scores, keyed by (metric, version) or by metric alone."""
    version = ["version"] if with_version else []
    infix = "_version" if with_version else ""
    op.create_index(
        f"ix_scores_metric{infix}_started",
        "scores",
        ["metric", *version, "trace_started_at"],
        unique=False,
        postgresql_include=["app_name", "status", "value"],
    )
    op.create_index(
        f"ix_scores_app_metric{infix}_started",
        "scores",
        ["app_name", "metric", *version, "trace_started_at"],
        unique=False,
    )
    op.create_index(
        f"ix_scores_metric{infix}_value",
        "scores",
        ["metric", *version, "value"],
        unique=False,
        postgresql_where=sa.text("status = 'scored'"),
        sqlite_where=sa.text("status = 'scored'"),
    )


def upgrade() -> None:
    op.drop_index("ix_scores_metric_started", table_name="scores")
    op.drop_index("ix_scores_app_metric_started", table_name="scores")
    op.drop_index("ix_scores_metric_value", table_name="scores")
    _score_indexes(with_version=True)
    op.drop_table("summary_cache")
    _summary_cache(with_version=True)


def downgrade() -> None:
    op.drop_table("summary_cache")
    _summary_cache(with_version=False)
    op.drop_index("ix_scores_metric_version_value", table_name="scores")
    op.drop_index("ix_scores_app_metric_version_started", table_name="scores")
    op.drop_index("ix_scores_metric_version_started", table_name="scores")
    _score_indexes(with_version=False)
