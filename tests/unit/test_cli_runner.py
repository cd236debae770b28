"""The in-process command line of the tests (``tests/support/cli.py``) behaves like a separate
interpreter: its own streams and exit codes, the environment and folder it is given, log lines
on its stderr, a traceback for a bug, and nothing of it left behind in the test process."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.support.cli import run_cli


def test_streams_and_exit_codes_are_the_commands(tmp_path: Path) -> None:
    help_run = run_cli("--help")
    assert help_run.returncode == 0
    assert help_run.stdout.startswith("usage: recalltrace") and help_run.stderr == ""
    refused = run_cli("scores", "summary", "--no-such-option")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "unrecognized arguments: --no-such-option" in refused.stderr
    missing = run_cli("db", "current", "--database-url", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 2
    assert missing.stderr.startswith("recalltrace: error: ") and "Traceback" not in missing.stderr


def test_environment_and_folder_are_given_then_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALLTRACE_DATABASE_URL", f"sqlite:///{tmp_path / 'exported.db'}")
    before_env, before_cwd = dict(os.environ), os.getcwd()
    # Without $RECALLTRACE_DATABASE_URL the commands default to ./recalltrace.db in the folder
    # they run in: asked about it, `db current` names that file.
    env = {k: v for k, v in os.environ.items() if k != "RECALLTRACE_DATABASE_URL"}
    done = run_cli("db", "current", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert "recalltrace.db" in done.stderr and "exported.db" not in done.stderr
    assert dict(os.environ) == before_env and os.getcwd() == before_cwd


def test_log_lines_reach_its_stderr_and_the_root_logger_is_put_back(tmp_path: Path) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    url = f"sqlite:///{tmp_path / 'logged.db'}"
    done = run_cli("-v", "db", "upgrade", "--database-url", url)
    assert done.returncode == 0, done.stderr
    assert " INFO " in done.stderr  # the -v log lines, formatted by main()'s basicConfig
    assert root.handlers == handlers and root.level == level


def test_a_logger_a_command_quiets_is_quiet_in_that_run_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import recalltrace.cli as cli

    worker_logger = logging.getLogger("recalltrace.worker")
    before = worker_logger.level

    def quiets(argv: list[str]) -> int:  # what `recalltrace demo` does to the worker's logger
        worker_logger.setLevel(logging.ERROR)
        return 0

    monkeypatch.setattr("tests.support.cli.main", quiets)
    assert run_cli("demo").returncode == 0
    assert worker_logger.level == before
    assert cli.main is not quiets


def test_a_bug_is_a_traceback_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import recalltrace.cli as cli

    def broken(argv: list[str]) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr("tests.support.cli.main", broken)
    done = run_cli("scores", "summary")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: a bug" in done.stderr
    assert cli.main is not broken
