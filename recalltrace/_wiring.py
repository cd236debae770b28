"""Where the parts meet: storage opened with the scorers' catalog.

Storage knows no variants; everything that opens a repository or a history for the product
(the tracer's default sink, the worker, the command line, the demo) comes through here, so the
job specifications and current versions it hands to storage are the catalog's. Every import is
inside a function: importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy import Engine

    from recalltrace.scorers.worker import WorkerOptions, WorkerStats
    from recalltrace.storage.history import History
    from recalltrace.storage.repository import Repository


def open_repository(
    url: str | None = None,
    *,
    metrics: Sequence[str] | None = None,
    create_schema: bool | None = None,
    **options: Any,
) -> Repository:
    """Open the repository on ``url`` (default: ``$RECALLTRACE_DATABASE_URL``, else SQLite)
    with every variant of the catalog known.

    ``metrics`` are the variants whose jobs are created when traces are written: by default
    those named by ``$RECALLTRACE_METRICS``, else all seven. ``create_schema`` as for
    :func:`recalltrace.storage.repository.open_repository`; ``reference_ttl`` and
    ``max_attempts`` pass through.
    """
    from recalltrace.scorers.catalog import job_specs, metrics_from_env
    from recalltrace.storage.repository import open_repository as open_with_specs

    return open_with_specs(
        url,
        specs=job_specs(),
        metrics=metrics if metrics is not None else metrics_from_env(),
        create_schema=create_schema,
        **options,
    )


def repository(
    engine: Engine,
    *,
    metrics: Sequence[str] | None = None,
    reference_ttl: timedelta | None = None,
    max_attempts: int | None = None,
) -> Repository:
    """A repository on an engine the caller owns, with every variant of the catalog known."""
    from recalltrace.scorers.catalog import job_specs
    from recalltrace.storage.repository import Repository

    options: dict[str, Any] = {}
    if reference_ttl is not None:
        options["reference_ttl"] = reference_ttl
    if max_attempts is not None:
        options["max_attempts"] = max_attempts
    return Repository(engine, specs=job_specs(), metrics=metrics, **options)


def history(engine: Engine) -> History:
    """History queries on ``engine``, reading each variant at its current catalog version."""
    from recalltrace.scorers.catalog import current_versions
    from recalltrace.storage.history import History

    return History(engine, current_versions())


def open_history(url: str | None = None) -> History:
    """History queries on ``url`` (default: ``$RECALLTRACE_DATABASE_URL``, else SQLite)."""
    from recalltrace.storage.db import create_engine_from_url

    return history(create_engine_from_url(url))


def run_worker(
    options: WorkerOptions | None = None,
    *,
    once: bool = False,
    on_progress: Callable[[WorkerStats], None] | None = None,
) -> WorkerStats:
    """Run a scoring worker in this process (``recalltrace worker`` from Python): until
    stopped, or with ``once`` until nothing is due. Like the command, it stores the history's
    summaries in the background (``WorkerOptions.summaries_interval_s``) so that history queries
    read them; ``recalltrace.scorers.worker.run_worker`` is the same without that."""
    from recalltrace.scorers.worker import Worker, WorkerOptions

    options = options if options is not None else WorkerOptions()
    store = open_repository(options.database_url)
    worker = Worker(
        options,
        repository=store,
        on_progress=on_progress,
        warm=history(store.engine).warm_summaries,
    )
    import asyncio

    try:
        return asyncio.run(worker.run(once=once))
    finally:
        worker.close()


def default_sink(
    database_url: str | None,
    *,
    create_schema: bool | None = None,
    separate_process: bool = False,
    scrubbing: Any = None,
    assembly: Any = None,
    nice: int = 0,
    metrics: Sequence[str] | None = None,
) -> Any:
    """The tracer's default sink: the repository on ``database_url`` (or, with
    ``separate_process``, a child process that stores through it: ``recalltrace._storage_process``;
    ``scrubbing``, the options that process scrubs the records with; ``assembly``, the options
    it assembles plain traces with; ``nice``, how much lower its CPU priority is).

    ``create_schema`` is the tracer's ``auto_migrate``: ``True`` creates or upgrades the
    schema; ``None`` creates it in a Postgres database that has none of it (no recalltrace table,
    no revision), so a script pointed at a fresh database stores its traces, and never upgrades
    an older schema; ``False`` leaves a Postgres schema alone. SQLite creates and upgrades in
    every case. Creating and upgrading hold the migration lock (``storage.migrate``), so
    processes starting together on a fresh database create it once.
    """
    if separate_process:
        from recalltrace._storage_process import StorageProcessSink

        return StorageProcessSink(
            database_url,
            create_schema=create_schema,
            scrubbing=scrubbing,
            assembly=assembly,
            nice=nice,
            metrics=metrics,
        )
    repository = open_repository(
        database_url,
        metrics=metrics,
        create_schema=True if create_schema else None,
        newer_schema="carry_on",
    )
    if create_schema is None and repository.is_postgres:
        import logging

        from recalltrace.storage.errors import is_database_unavailable
        from recalltrace.storage.migrate import create_schema_if_missing

        logger = logging.getLogger("recalltrace")
        shown = repository.engine.url.render_as_string(hide_password=True)
        try:
            if create_schema_if_missing(repository.engine):
                logger.info(
                    "recalltrace: created the recalltrace tables in the empty database %s", shown
                )
        except Exception as exc:
            if is_database_unavailable(exc):
                # Not reachable (or another process is migrating it): the writer keeps the
                # records and opens the sink again later.
                repository.dispose()
                raise
            # Refused (a role that may not create tables): the records are kept, and the writer
            # says to run `recalltrace db upgrade` when a write finds no tables.
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            logger.warning(
                "recalltrace: could not create the recalltrace tables in the empty database %s "
                "(%s: %s); run `recalltrace db upgrade` as a role that may create tables",
                shown,
                type(exc).__name__,
                first,
            )
    return repository


def warm_default_sink(database_url: str | None) -> None:
    """Import what :func:`default_sink` on ``database_url`` imports (the repository, the
    catalog, the database driver), opening nothing."""
    import importlib

    import recalltrace.scorers.catalog
    import recalltrace.storage.repository  # noqa: F401
    from recalltrace.storage.db import resolve_database_url

    url = resolve_database_url(database_url)
    if url.startswith("postgresql"):
        importlib.import_module("psycopg")


def check_default_sink(metrics: Sequence[str] | None = None) -> None:
    """What ``configure()`` checks before any trace is written: the variants of its
    ``metrics`` (else those named by ``$RECALLTRACE_METRICS``) exist (a typo would otherwise fail
    every write)."""
    from recalltrace.scorers.catalog import CATALOG, metrics_from_env

    if metrics is None:
        metrics_from_env()
        return
    if isinstance(metrics, str):
        raise ValueError(
            f"metrics must be a list of variant keys, not the string {metrics!r}; "
            f"known metrics: {', '.join(CATALOG)}"
        )
    for key in metrics:
        if key not in CATALOG:
            raise ValueError(
                f"configure's metrics (or RECALLTRACE_METRICS) name an unknown metric {key!r}; "
                f"known metrics: {', '.join(CATALOG)}"
            )
