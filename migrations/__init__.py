"""Alembic migrations of the recalltrace schema, shipped inside the wheel."""
