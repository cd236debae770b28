"""Shared fixtures: a real Postgres database (fresh and migrated) and SQLite files.

Postgres is reached at ``$RECALLTRACE_TEST_DATABASE_URL`` (default: the local server's ``test``
database). Each test session creates its own database next to it, so parallel runs never share
state. When Postgres is unreachable the Postgres tests are skipped, except under ``CI=true``
where that is an error.

Databases start as copies of a migrated template (``tests/support/databases.py``) instead of a
migration each. The run is spread over every core when pytest-xdist is installed (each xdist
worker has its own session database). ``python -m pytest`` with neither paths nor ``-m`` leaves
out the tests marked ``realsystem`` (the second stage, ``python -m pytest -m realsystem``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from recalltrace.scorers._judge import LITELLM_HTTP_FLAG
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.repository import Repository
from tests.support.databases import copied_postgres_database, migrated_sqlite
from tests.support.factories import make_repository
from tests.support.postgres import require_postgres, truncate_all

REAL_SYSTEM = "realsystem"


def _workers() -> int:
    """How many xdist workers a default run starts: one per core this process may use
    (``$RECALLTRACE_TEST_WORKERS`` overrides it)."""
    given = os.environ.get("RECALLTRACE_TEST_WORKERS", "")
    if given.isdigit():
        return int(given)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def pytest_configure(config: pytest.Config) -> None:
    """Keep the tracer's ledger files of this run in a directory of its own (the processes the
    tests start inherit it), so that a process a test kills is said within this run only.
    Spread the run over every core when pytest-xdist is installed and ``-n`` was not given
    (``-n 0`` keeps one process; so does ``--pdb``, ``--collect-only`` and one core); how the
    tests are handed out is ``--dist`` when given, else work stealing."""
    if "RECALLTRACE_RUN_DIR" not in os.environ:
        os.environ["RECALLTRACE_RUN_DIR"] = tempfile.mkdtemp(prefix="recalltrace-tests-run-")
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    option = config.option
    if getattr(option, "numprocesses", None) is not None or getattr(option, "tx", None):
        return
    if option.usepdb or option.collectonly:
        return
    workers = _workers()
    if workers < 2:
        return
    option.numprocesses = workers
    option.tx = ["popen"] * workers
    if getattr(option, "dist", "no") == "no":
        # Test lengths differ by two orders of magnitude: an idle worker takes from a busy one.
        # (The real-system stage passes --dist loadfile: its module fixtures, a built wheel or
        # a Phoenix server, are made once.)
        option.dist = "worksteal"


def _default_stage(config: pytest.Config) -> bool:
    """Whether this is the default stage: ``python -m pytest`` with neither paths nor ``-m``
    (an xdist worker is told by the run that started it)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _DEFAULT_STAGE in workerinput:
        return bool(workerinput[_DEFAULT_STAGE])
    given_paths = config.args_source != pytest.Config.ArgsSource.TESTPATHS
    return not config.option.markexpr and not given_paths


_DEFAULT_STAGE = "recalltrace_default_stage"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each xdist worker whether the run is the default stage."""
    node.workerinput[_DEFAULT_STAGE] = _default_stage(node.config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default stage leaves out the real-system tests: ``-m realsystem`` runs them, and so
    does naming their files or folders."""
    if not _default_stage(config):
        return
    kept = [item for item in items if REAL_SYSTEM not in item.keywords]
    if len(kept) != len(items):
        config.hook.pytest_deselected(
            items=[item for item in items if REAL_SYSTEM in item.keywords]
        )
        items[:] = kept


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say how many real-system tests the default stage left out, and how to run them."""
    if hasattr(config, "workerinput") or not _default_stage(config) or config.option.keyword:
        return
    left_out = len(terminalreporter.stats.get("deselected", []))
    if left_out:
        terminalreporter.write_line(
            f"{left_out} real-system test(s) were left out of this stage (an installed wheel, "
            "servers, Prometheus, kill rounds): run them with `python -m pytest -m realsystem`"
        )


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
    """URL of a fresh, migrated Postgres database for this test session (or xdist worker): a
    copy of the migrated template."""
    require_postgres()
    with copied_postgres_database(f"rt_test_{os.getpid()}_{uuid.uuid4().hex[:8]}") as url:
        yield url


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[Engine]:
    """An engine on the session's Postgres database, emptied before the test."""
    engine = create_engine_from_url(postgres_url, pool_size=10, max_overflow=10)
    truncate_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh, migrated SQLite file (a copy of the migrated template)."""
    return migrated_sqlite(tmp_path / "recalltrace.db")


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
