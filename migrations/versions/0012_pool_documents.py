"""pool documents and cached relevance judgments

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 13:15:00.000000

``pool_documents`` keeps, per trace, the documents a second retrieval (the ``pool=`` callable of
``@retrieval``) returned, in its rank order, with the pool's name as ``source``. They arrive
after their trace, like a late reference, so the rows keep a foreign key to ``traces`` (deleted
with it). ``judgments`` keeps judge answers that depend only on their inputs, by the caller's
digest of those inputs (opaque JSON to storage), so a repeated document costs no second call.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "pool_documents",
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("context_id", sa.String(length=500), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("source", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["trace_id"], ["traces.trace_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trace_id", "position"),
    )
    op.create_table(
        "judgments",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("answer", json_type, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("judgments")
    op.drop_table("pool_documents")
