"""request attributes: release, environment, user and session ids, tags

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 14:00:00.000000

Records gain the attributes history is sliced by: ``release`` and ``environment`` (from the
tracer's configuration or the OpenTelemetry resource: ``service.version``,
``deployment.environment.name``), ``user_id`` and ``session_id`` (set inside a request, or
``user.id``/``session.id`` on captured spans), each indexed with the start time; and tags, one
row per tag in ``trace_tags`` (indexed by tag), also kept as a list on the trace. Scores gain
an index on (model, scored_at): a worker with a judge budget sums the period's spend of its
model, read by every worker before claiming LLM jobs. Scores also keep their trace's release
and environment (as they keep its app and start time), with an index carrying them, so
comparing releases reads one index instead of joining every score to its trace. Human labels get a table of their own,
``labels``: a score in [0, 1] (and optionally per-claim verdicts) for a trace and variant, with
who labelled it and a note, one per (trace, variant, labeller).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COLUMNS = ("release", "environment", "user_id", "session_id")


def upgrade() -> None:
    json_type = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )
    for name in _COLUMNS:
        op.add_column("traces", sa.Column(name, sa.String(length=200), nullable=True))
        op.create_index(f"ix_traces_{name}_started_at", "traces", [name, "started_at"])
    op.add_column("traces", sa.Column("tags", json_type, nullable=True))
    op.create_table(
        "trace_tags",
        sa.Column(
            "trace_id",
            sa.String(length=32),
            sa.ForeignKey("traces.trace_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("tag", sa.String(length=200), primary_key=True),
    )
    op.create_index("ix_trace_tags_tag", "trace_tags", ["tag", "trace_id"])
    op.create_index("ix_scores_model_scored_at", "scores", ["model", "scored_at"])
    op.add_column("scores", sa.Column("release", sa.String(length=200), nullable=True))
    op.add_column("scores", sa.Column("environment", sa.String(length=200), nullable=True))
    op.execute(
        "UPDATE scores SET release = (SELECT release FROM traces t WHERE t.trace_id = "
        "scores.trace_id), environment = (SELECT environment FROM traces t WHERE "
        "t.trace_id = scores.trace_id)"
    )
    op.create_index(
        "ix_scores_metric_version_started_attrs",
        "scores",
        ["metric", "version", "trace_started_at"],
        postgresql_include=["release", "environment", "status", "value"],
    )
    op.create_table(
        "labels",
        sa.Column(
            "trace_id",
            sa.String(length=32),
            sa.ForeignKey("traces.trace_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("metric", sa.String(length=64), primary_key=True),
        sa.Column("labeller", sa.String(length=200), primary_key=True),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("claims", json_type, nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_labels_metric", "labels", ["metric", "trace_id"])


def downgrade() -> None:
    op.drop_index("ix_scores_metric_version_started_attrs", table_name="scores")
    op.drop_column("scores", "environment")
    op.drop_column("scores", "release")
    op.drop_index("ix_labels_metric", table_name="labels")
    op.drop_table("labels")
    op.drop_index("ix_scores_model_scored_at", table_name="scores")
    op.drop_index("ix_trace_tags_tag", table_name="trace_tags")
    op.drop_table("trace_tags")
    op.drop_column("traces", "tags")
    for name in reversed(_COLUMNS):
        op.drop_index(f"ix_traces_{name}_started_at", table_name="traces")
        op.drop_column("traces", name)
