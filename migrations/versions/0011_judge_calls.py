"""judge calls: answers kept until their job's result is stored

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 12:40:00.000000

``judge_calls`` keeps each judge call's answer, keyed by a digest of the request, from the
moment it arrives until the result of the job that asked is stored (or it is older than the
retention), so a job taken again after its worker was killed reads the answer instead of paying
for the call again. ``scope`` names the job that paid; ``answer`` is the worker's JSON.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "judge_calls",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=200), nullable=False),
        sa.Column("answer", json_type, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_judge_calls_scope", "judge_calls", ["scope"])
    op.create_index("ix_judge_calls_created_at", "judge_calls", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_judge_calls_created_at", table_name="judge_calls")
    op.drop_index("ix_judge_calls_scope", table_name="judge_calls")
    op.drop_table("judge_calls")
