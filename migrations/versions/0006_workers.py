"""workers report the variants they score, so jobs nobody serves can be named

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 20:00:00.000000

A new table ``workers``: one row per worker process (its id, host, pid, the variants it
scores, when it started and when it was last seen). ``recalltrace jobs list`` and the
workers' own maintenance read it to tell jobs of a variant no worker runs ("unserved") from
jobs that are late. Job status ``cancelled`` (``recalltrace jobs cancel``) needs no schema
change: the status column is free text.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_type = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=200), primary_key=True),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("metrics", json_type, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workers")
