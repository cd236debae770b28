"""a trace's contexts, tags and jobs go with it by trigger, not by foreign key

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 06:20:00.000000

``retrieved_contexts``, ``trace_tags`` and ``scoring_jobs`` rows are written with their trace,
in the transaction that writes it (jobs also by a rescore, selected from the stored traces in
its statement). Their foreign keys made the database look the trace up
again and lock it for every one of those rows (sixteen for a usual record), a large share of its
work per stored request (benchmarks/README.md). They go; a trigger on ``traces`` deletes a
deleted trace's rows in those tables instead, whoever deletes it (``recalltrace db prune`` or an
operator's own ``DELETE``), so deleting behaves as the cascade did. ``scores`` and ``labels``
keep their foreign keys: they are written later, by workers and people, against stored traces.
A rescore racing the deletion of its trace can leave a job behind; a worker then finds no trace
and fails the job, saying so.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_CHILDREN = ("retrieved_contexts", "trace_tags", "scoring_jobs")
# The name Postgres gave each foreign key (none was named when it was created), and the one
# SQLite's reflection gets from the naming convention below.
_SQLITE_FK = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}

_POSTGRES_FUNCTION = """
CREATE FUNCTION recalltrace_delete_trace_children() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM retrieved_contexts c USING deleted_traces d WHERE c.trace_id = d.trace_id;
    DELETE FROM trace_tags t USING deleted_traces d WHERE t.trace_id = d.trace_id;
    DELETE FROM scoring_jobs j USING deleted_traces d WHERE j.trace_id = d.trace_id;
    RETURN NULL;
END
$$
"""
_POSTGRES_TRIGGER = """
CREATE TRIGGER traces_delete_children AFTER DELETE ON traces
REFERENCING OLD TABLE AS deleted_traces
FOR EACH STATEMENT EXECUTE FUNCTION recalltrace_delete_trace_children()
"""
_SQLITE_TRIGGER = """
CREATE TRIGGER traces_delete_children AFTER DELETE ON traces
FOR EACH ROW BEGIN
    DELETE FROM retrieved_contexts WHERE trace_id = OLD.trace_id;
    DELETE FROM trace_tags WHERE trace_id = OLD.trace_id;
    DELETE FROM scoring_jobs WHERE trace_id = OLD.trace_id;
END
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _CHILDREN:
            op.drop_constraint(f"{table}_trace_id_fkey", table, type_="foreignkey")
        op.execute(_POSTGRES_FUNCTION)
        op.execute(_POSTGRES_TRIGGER)
        return
    for table in _CHILDREN:
        with op.batch_alter_table(table, recreate="always", naming_convention=_SQLITE_FK) as batch:
            batch.drop_constraint(f"fk_{table}_trace_id_traces", type_="foreignkey")
    op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute("DROP TRIGGER IF EXISTS traces_delete_children" + (" ON traces" if postgres else ""))
    if postgres:
        op.execute("DROP FUNCTION IF EXISTS recalltrace_delete_trace_children()")
    for table in _CHILDREN:
        # Rows left without their trace (none is written so) would fail the foreign key.
        op.execute(
            sa.text(f"DELETE FROM {table} WHERE trace_id NOT IN (SELECT trace_id FROM traces)")
        )
        if postgres:
            op.create_foreign_key(
                f"{table}_trace_id_fkey",
                table,
                "traces",
                ["trace_id"],
                ["trace_id"],
                ondelete="CASCADE",
            )
            continue
        with op.batch_alter_table(table, recreate="always") as batch:
            batch.create_foreign_key(
                f"fk_{table}_trace_id_traces",
                "traces",
                ["trace_id"],
                ["trace_id"],
                ondelete="CASCADE",
            )
