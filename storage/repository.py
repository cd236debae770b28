"""The repository: one database's traces, scoring jobs and scores behind one object.

What it does lives in modules with one reason to change each: :mod:`.traces` (trace writes),
:mod:`.queue` (the job queue and score writes), :mod:`.summary_cache` (the cached summaries and
their lock), :mod:`._dialect` (what differs between Postgres and SQLite). Storage knows nothing
of the variants: the caller hands it the :class:`~.contracts.JobSpec` of every known metric.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Literal

from sqlalchemy import Engine

from recalltrace.storage._dialect import dialect_of
from recalltrace.storage._storable import UNSTORABLE_TEXT
from recalltrace.storage.contracts import (
    NOTIFY_CHANNEL,
    ClaimedJob,
    JobSpec,
    JobStore,
    QueueStats,
    ScoreLike,
    TraceInputs,
    TraceNotFound,
    spec_map,
)
from recalltrace.storage.db import create_engine_from_url, engine_notes
from recalltrace.storage.judge_calls import JudgeAnswers
from recalltrace.storage.queue import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_REFERENCE_TTL,
    JobQueue,
)
from recalltrace.storage.summary_cache import SUMMARY_LOCK_KEY
from recalltrace.storage.traces import TraceWrites
from recalltrace.storage.workers import WorkerRegistry

logger = logging.getLogger("recalltrace.storage")

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_REFERENCE_TTL",
    "NOTIFY_CHANNEL",
    "SUMMARY_LOCK_KEY",
    "UNSTORABLE_TEXT",
    "ClaimedJob",
    "JobSpec",
    "JobStore",
    "QueueStats",
    "Repository",
    "ScoreLike",
    "TraceInputs",
    "TraceNotFound",
    "open_repository",
]


class Repository(TraceWrites, JobQueue, WorkerRegistry, JudgeAnswers):
    """Traces, scoring jobs and scores on one database, and the judge answers workers keep
    until their jobs' results are stored.

    ``specs`` are the job specifications of every known metric (``attach_reference`` releases
    the waiting jobs of any of them); ``metrics`` are those whose jobs are created when traces
    are written (default: all). ``reference_ttl`` bounds how long a job waits for a late
    reference before it is skipped.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        specs: Iterable[JobSpec],
        metrics: Sequence[str] | None = None,
        reference_ttl: timedelta = DEFAULT_REFERENCE_TTL,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.engine = engine
        self.dialect = dialect_of(engine)
        self.specs = spec_map(specs)
        keys = list(metrics) if metrics is not None else list(self.specs)
        self.metrics = [self.spec(k) for k in keys]
        if reference_ttl <= timedelta(0):
            raise ValueError("reference_ttl must be positive")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.reference_ttl = reference_ttl
        self.max_attempts = max_attempts
        self._score_upsert = self._build_score_upsert()

    @property
    def is_postgres(self) -> bool:
        """Whether the database is Postgres (else SQLite)."""
        return self.dialect.postgres

    def notify_dsn(self) -> str | None:
        """The libpq connection string workers ``LISTEN`` on (Postgres); ``None`` on SQLite."""
        return self.dialect.notify_dsn(self.engine)

    async def wait_for_jobs(
        self, wake: Callable[[], None], *, reconnect_after_s: float = 5.0
    ) -> None:
        """Call ``wake`` whenever new jobs may have become due, until cancelled.

        On Postgres this listens on :data:`~.contracts.NOTIFY_CHANNEL`: ``wake`` is called once
        the listener is connected (jobs may have arrived before it was) and on every
        notification; a lost connection is logged and reconnected after ``reconnect_after_s``
        (the caller's polling covers the gap). SQLite announces nothing: this returns at once
        and the caller polls.
        """
        dsn = self.notify_dsn()
        if dsn is None:
            return
        import asyncio

        import psycopg

        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    wake()
                    async for _notify in conn.notifies():
                        wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                text = str(exc).strip().splitlines()
                logger.warning(
                    "LISTEN connection lost (%s: %s); polling meanwhile",
                    type(exc).__name__,
                    text[0] if text else "",
                )
                await asyncio.sleep(reconnect_after_s)

    def dispose(self) -> None:
        """Close every pooled connection (call in a forked child or at exit)."""
        self.engine.dispose()


def open_repository(
    url: str | None = None,
    *,
    specs: Iterable[JobSpec],
    metrics: Sequence[str] | None = None,
    reference_ttl: timedelta = DEFAULT_REFERENCE_TTL,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    create_schema: bool | None = None,
    newer_schema: Literal["refuse", "carry_on"] = "refuse",
) -> Repository:
    """Open a repository on ``url`` (default: ``$RECALLTRACE_DATABASE_URL`` or SQLite).

    ``specs`` and ``metrics`` are as for :class:`Repository`. ``create_schema`` runs the
    migrations to head first; by default it does so on SQLite (the embedded default just
    works) and not on Postgres, where ``recalltrace db upgrade`` is a deliberate deployment
    step. A schema newer than this version (a newer recalltrace migrated it) cannot be
    migrated: ``newer_schema="refuse"`` raises :class:`~recalltrace.storage.migrate.
    SchemaNewerError`; ``"carry_on"`` (the tracer's: its records are written as they are on a
    Postgres it does not migrate) opens it as it stands, said in one WARNING line.
    """
    engine = create_engine_from_url(url)
    if create_schema is None:
        create_schema = dialect_of(engine).migrates_on_open
    if create_schema:
        from recalltrace.storage.migrate import SchemaNewerError, schema_state, upgrade_engine

        state = schema_state(engine)
        if state.state == "newer":
            newer = SchemaNewerError(engine, state)
            if newer_schema == "refuse":
                engine.dispose()
                raise newer
            logger.warning("recalltrace: %s; its records are stored without migrating it", newer)
        else:
            upgrade_engine(engine)
        # Allowed to create the schema: also on a SQLite file that replaces this one.
        engine_notes(engine)["recreate_schema"] = True
    return Repository(
        engine,
        specs=specs,
        metrics=metrics,
        reference_ttl=reference_ttl,
        max_attempts=max_attempts,
    )
