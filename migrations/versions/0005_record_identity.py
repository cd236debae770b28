"""a record is one request: keep its OpenTelemetry trace and span ids beside its own id

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 13:10:00.000000

Until now a record's id was the OpenTelemetry trace id, so several requests in one trace (an
application span around several calls, a propagated ``traceparent``) were stored as one. A
record now has its own id in ``traces.trace_id``; the trace id and the root span id it ran
under are kept in two new columns (empty for records stored before, whose ``trace_id`` is
their trace id). Building the index locks writes to ``traces`` while it runs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.add_column(sa.Column("otel_trace_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("otel_span_id", sa.String(length=16), nullable=True))
    op.create_index("ix_traces_otel_trace_id", "traces", ["otel_trace_id"])


def downgrade() -> None:
    op.drop_index("ix_traces_otel_trace_id", table_name="traces")
    with op.batch_alter_table("traces") as batch:
        batch.drop_column("otel_span_id")
        batch.drop_column("otel_trace_id")
