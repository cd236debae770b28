"""history rollups: per-hour group sums and judge cost, and the indexes behind them

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 20:00:00.000000

``group_cache`` keeps, per ended hour of trace start, variant, scope (app and release or
environment filters) and grouping attribute (release, environment, tag), each group's count,
sum, sum of squares and count of values other than 0 and 1: what ``scores compare`` needs, and
additive, so a window is the sum of its hours. ``cost_cache`` keeps, per ended hour of scoring,
scope, variant and judge model, the judge calls' count, tokens and money. Both are dropped
where the scores they sum change, like ``summary_cache``. Scores gain an index on
``scored_at`` (the live edges of a cost window), and traces a hash index on ``user_input``
(counting the traces that asked the same question; a hash index takes questions of any length).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_cache",
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("scope", sa.String(length=200), nullable=False),
        sa.Column("attribute", sa.String(length=32), nullable=False),
        sa.Column("missing", sa.Boolean(), nullable=False),
        sa.Column("group_value", sa.String(length=200), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("total_sq", sa.Float(), nullable=False),
        sa.Column("fractional", sa.Integer(), nullable=False),
        sa.Column("first_started", sa.DateTime(timezone=True), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "bucket_start", "metric", "version", "scope", "attribute", "missing", "group_value"
        ),
    )
    op.create_table(
        "cost_cache",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("scope", sa.String(length=200), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("unpriced", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("hour", "scope", "metric", "model"),
    )
    op.create_index("ix_scores_scored_at", "scores", ["scored_at"])
    op.create_index("ix_traces_user_input", "traces", ["user_input"], postgresql_using="hash")


def downgrade() -> None:
    op.drop_index("ix_traces_user_input", table_name="traces")
    op.drop_index("ix_scores_scored_at", table_name="scores")
    op.drop_table("cost_cache")
    op.drop_table("group_cache")
