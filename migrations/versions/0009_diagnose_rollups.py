"""diagnose rollups: per-hour sums of what ``scores diagnose`` reads

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 18:00:00.000000

``diagnose_cache`` keeps, per ended hour of trace start, variant, scope (app and release or
environment filters) and section, what a diagnosis sums: per slice (request attribute value or
retrieved documents' metadata value) the count, sum and sum of squares; per reference the
requests that needed it and those that retrieved it; per claim how often it was judged and not
supported; with example traces and their sort keys (arrays on Postgres). Additive, so a window is
the sum of its hours; dropped where the scores they sum change, like ``group_cache``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    text_array = sa.JSON().with_variant(postgresql.ARRAY(sa.Text()), "postgresql")
    float_array = sa.JSON().with_variant(postgresql.ARRAY(sa.Float()), "postgresql")
    op.create_table(
        "diagnose_cache",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("scope", sa.String(length=200), nullable=False),
        sa.Column("section", sa.String(length=16), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("total_sq", sa.Float(), nullable=False),
        sa.Column("example_ids", text_array, nullable=True),
        sa.Column("example_keys", float_array, nullable=True),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_diagnose_cache_hour",
        "diagnose_cache",
        ["metric", "version", "scope", "section", "bucket_start"],
    )
    op.create_index("ix_diagnose_cache_metric_hour", "diagnose_cache", ["metric", "bucket_start"])


def downgrade() -> None:
    op.drop_index("ix_diagnose_cache_metric_hour", table_name="diagnose_cache")
    op.drop_index("ix_diagnose_cache_hour", table_name="diagnose_cache")
    op.drop_table("diagnose_cache")
