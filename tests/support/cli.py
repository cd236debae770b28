"""The ``recalltrace`` command line as the tests run it.

:func:`run_cli` runs ``recalltrace.cli.main`` in this process, the way a separate interpreter
would see it: the environment and working directory it is given, its own stdout and stderr,
log lines on its stderr, an exit code (argparse's ``SystemExit`` included) and, for a bug, a
traceback on stderr with exit code 1. Most command-line tests are about the command's logic
(what it prints, what it refuses, what it writes): in process they cost milliseconds instead of
an interpreter start.

The tests that are about the process itself (exit codes on signals, a real terminal, several
processes at once, an installed entry point, what a process exports at exit) keep running
``python -m recalltrace`` as a separate process.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from recalltrace.cli import main

__all__ = ["run_cli"]


@contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """``os.environ`` replaced by ``env`` (when given) for the duration, then put back."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _working_directory(cwd: str | Path | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved)


@contextmanager
def _fresh_logging() -> Iterator[None]:
    """The root logger as a fresh interpreter has it (no handlers), so that ``main``'s
    ``logging.basicConfig`` writes log lines to the captured stderr; afterwards every logger
    that existed before gets its level, handlers and switches back (a command that quiets a
    logger, as the demo quiets the worker's, quiets it in its own process only)."""
    root = logging.getLogger()
    loggers = [root] + [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    saved = [
        (logger, logger.level, list(logger.handlers), logger.propagate, logger.disabled)
        for logger in loggers
    ]
    root.handlers = []
    try:
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        for logger, level, handlers, propagate, disabled in saved:
            logger.setLevel(level)
            logger.handlers = handlers
            logger.propagate = propagate
            logger.disabled = disabled


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: str = "",
) -> subprocess.CompletedProcess[str]:
    """``recalltrace ARGS`` in this process, as a :class:`subprocess.CompletedProcess`.

    ``env`` replaces the whole environment (as ``subprocess.run(env=...)`` does); ``stdin`` is
    what the command reads from standard input.
    """
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(env),
        _working_directory(cwd),
        _fresh_logging(),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        saved_stdin = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse refusing an argument, or a sys.exit()
            if exc.code is None or isinstance(exc.code, int):
                code = int(exc.code or 0)
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except Exception:  # an interpreter would print the traceback and exit 1
            traceback.print_exc()
            code = 1
        finally:
            sys.stdin = saved_stdin
    return subprocess.CompletedProcess(
        ["recalltrace", *args], code, stdout=out.getvalue(), stderr=err.getvalue()
    )
