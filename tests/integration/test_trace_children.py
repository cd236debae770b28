"""A deleted trace takes its contexts, tags, jobs, scores and labels with it, however it is
deleted (``recalltrace db prune`` or an operator's own ``DELETE``), on both backends; the
contexts, tags and jobs carry no foreign key (a trigger deletes them, migration 0010), and
migrating down puts the foreign keys back."""

from __future__ import annotations

from datetime import timedelta

from alembic import command
from sqlalchemy import Engine, inspect, text

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.labels import LabelInput, LabelStore
from recalltrace.storage.migrate import alembic_config, hold_migration_lock, upgrade_engine
from recalltrace.storage.repository import Repository
from tests.support.factories import make_repository, make_trace
from tests.support.postgres import empty_database

CHILDREN = ("retrieved_contexts", "trace_tags", "scoring_jobs", "scores", "labels")


def _counts(engine: Engine, trace_id: str) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table: conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE trace_id = :t"), {"t": trace_id}
            ).scalar_one()
            for table in CHILDREN
        }


def _stored_with_everything(repo: Repository) -> tuple[str, str]:
    """Two traces, each with contexts, a tag, jobs, a score and a label."""
    ids = []
    for _ in range(2):
        trace = make_trace()
        trace.tags = ["gold"]
        repo.write_traces([trace])
        ids.append(trace.trace_id)
    with repo.engine.begin() as conn:
        for trace_id in ids:
            conn.execute(
                text(
                    "INSERT INTO scores (trace_id, metric, version, app_name, trace_started_at,"
                    " status, value, reason, details, scored_at) SELECT trace_id, 'string_match',"
                    " '1', app_name, started_at, 'scored', 0.5, 'r', '{}', started_at"
                    " FROM traces WHERE trace_id = :t"
                ),
                {"t": trace_id},
            )
    LabelStore(repo.engine).write(
        [LabelInput(trace_id=ids[0], metric="string_match", value=1.0, labeller="ann")]
    )
    return ids[0], ids[1]


def _check_delete_takes_everything(url: str) -> None:
    engine = create_engine_from_url(url)
    try:
        repo = make_repository(engine)
        gone, kept = _stored_with_everything(repo)
        before = _counts(engine, gone)
        assert all(before[table] > 0 for table in CHILDREN), before
        kept_before = _counts(engine, kept)
        with engine.begin() as conn:  # an operator's own retention
            conn.execute(text("DELETE FROM traces WHERE trace_id = :t"), {"t": gone})
        assert _counts(engine, gone) == dict.fromkeys(CHILDREN, 0)
        assert _counts(engine, kept) == kept_before
        # Pruning by age deletes the same way.
        assert repo.delete_traces_before(make_trace().started_at + timedelta(days=1)) >= 1
        assert _counts(engine, kept) == dict.fromkeys(CHILDREN, 0)
    finally:
        engine.dispose()


def _foreign_keys(engine: Engine) -> dict[str, int]:
    found = inspect(engine)
    return {table: len(found.get_foreign_keys(table)) for table in CHILDREN}


def test_a_deleted_trace_takes_its_rows_with_it_on_postgres(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE traces CASCADE"))
        assert _foreign_keys(engine) == {
            "retrieved_contexts": 0,
            "trace_tags": 0,
            "scoring_jobs": 0,
            "scores": 1,
            "labels": 1,
        }
    finally:
        engine.dispose()
    _check_delete_takes_everything(postgres_url)


def test_a_deleted_trace_takes_its_rows_with_it_on_sqlite(sqlite_url: str) -> None:
    _check_delete_takes_everything(sqlite_url)


def _down_and_up(engine: Engine) -> None:
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        hold_migration_lock(conn, 30)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009")
    assert _foreign_keys(engine) == dict.fromkeys(CHILDREN, 1)
    upgrade_engine(engine)


def test_migrating_down_and_up_keeps_the_rows_and_the_cascade(sqlite_url: str) -> None:
    with empty_database("rt_children") as pg_url:
        for url in (pg_url, sqlite_url):
            engine = create_engine_from_url(url)
            try:
                upgrade_engine(engine)
                repo = make_repository(engine)
                _, kept = _stored_with_everything(repo)
                counts = _counts(engine, kept)
                _down_and_up(engine)
                assert _counts(engine, kept) == counts, url
                assert _foreign_keys(engine)["scoring_jobs"] == 0
            finally:
                engine.dispose()
            _check_delete_takes_everything(url)
