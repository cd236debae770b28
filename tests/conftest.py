"""Shared fixtures: a real Postgres database (fresh and migrated) and SQLite files.

Postgres is reached at ``$RECALLTRACE_TEST_DATABASE_URL`` (default: the local server's ``test``
database). Each test session creates its own database next to it, so parallel runs never share
state. When Postgres is unreachable the Postgres tests are skipped, except under ``CI=true``
where that is an error.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from recalltrace.scorers._judge import LITELLM_HTTP_FLAG
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.repository import Repository
from tests.support.factories import make_repository
from tests.support.postgres import admin_engine, base_url, require_postgres, truncate_all


@pytest.fixture(autouse=True)
def _working_directory_kept() -> Iterator[None]:
    """A test that changes the working directory and leaves it changed fails, by name: later
    tests (and their subprocesses) would run somewhere else."""
    before = os.getcwd()
    yield
    after = os.getcwd()
    if after != before:
        os.chdir(before)
        pytest.fail(f"the test left the working directory changed to {after}")


@pytest.fixture(autouse=True)
def _litellm_route_restored() -> Iterator[None]:
    """Put LiteLLM's HTTP route switch back after every test.

    A worker started in the test process sets it for the whole process (see
    ``scorers.load_judge_backend``); without this the route later tests take would depend on
    which tests ran before them.
    """
    before = os.environ.get(LITELLM_HTTP_FLAG)
    yield
    if before is None:
        os.environ.pop(LITELLM_HTTP_FLAG, None)
    else:
        os.environ[LITELLM_HTTP_FLAG] = before


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a fresh, migrated Postgres database for this test session."""
    require_postgres()
    name = f"rt_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(base_url()).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[Engine]:
    """An engine on the session's Postgres database, emptied before the test."""
    engine = create_engine_from_url(postgres_url, pool_size=10, max_overflow=10)
    truncate_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh, migrated SQLite file."""
    url = f"sqlite:///{tmp_path / 'recalltrace.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh migrated database on each backend (Postgres emptied first)."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    url = str(request.getfixturevalue("postgres_url"))
    engine = create_engine_from_url(url)
    truncate_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def repo(database_url: str) -> Iterator[Repository]:
    """A repository on each backend."""
    repository = make_repository(create_engine_from_url(database_url))
    yield repository
    repository.dispose()


@pytest.fixture
def pg_repo(pg_engine: Engine) -> Repository:
    """A repository on Postgres only (for the multi-worker cases)."""
    return make_repository(pg_engine)
