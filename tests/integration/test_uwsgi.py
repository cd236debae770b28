"""Every request a real uWSGI answered is its own stored row, with its own late reference.

uWSGI with its defaults loads the application (``configure()`` included) in the master and
forks the workers from C: Python's at-fork hooks do not run in them (``--py-call-osafterfork``
is off by default), so nothing a forked child would reset is reset. With ``--lazy-apps`` each
worker loads the application itself. Four client threads send 600 requests, each with a token
of its own as its question; each answer carries the record id the request was traced under and
the worker's pid. uWSGI is then shut down gracefully through its master FIFO (``q``: every
worker is sent SIGHUP, finishes its request and exits, running Python's ``atexit`` as it
does), or, with ``--die-on-term``, by SIGTERM (each worker is sent SIGINT and exits at once,
running ``atexit`` when idle; a busy worker skips it). A separate configured process then
attaches each token as the late reference of its record id. Every answered request must be a
row of its own (distinct ids across the workers, each row the request that logged its id, none
twice) holding its own reference, or a loss a tracer process said.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.answers import (
    Load,
    Server,
    check,
    free_port,
    require_tool,
    traced_env,
    wait_ready,
)

# The real-system stage (a uWSGI server under load).
pytestmark = pytest.mark.realsystem

APP = Path(__file__).with_name("traced_app.py")
CLIENTS = 4
PER_CLIENT = 150

# (options; how uWSGI is stopped: its master FIFO's ``q``, the graceful shutdown, or SIGTERM with
# --die-on-term, which sends each worker SIGINT; how many times the application is loaded: once,
# in the master, or by each worker with --lazy-apps)
CASES = {
    "processes-2": (["--processes", "2"], "fifo", 1),
    "processes-4": (["--processes", "4"], "fifo", 1),
    "threads-2": (["--processes", "2", "--threads", "2", "--enable-threads"], "fifo", 1),
    "lazy-apps": (["--processes", "2", "--lazy-apps"], "fifo", 2),
    "die-on-term": (["--processes", "2", "--die-on-term"], "sigterm", 1),
}


APP_READY = re.compile(r"WSGI app 0 \(mountpoint=''\) ready")


def wait_logged(server: Server, pattern: re.Pattern[str], count: int) -> None:
    """Wait until the server logged ``pattern`` ``count`` times."""
    deadline = time.monotonic() + 60
    while len(pattern.findall(server.output())) < count:
        assert server.alive(), server.output()[-3000:]
        assert time.monotonic() < deadline, f"not logged {count} times: {pattern.pattern}"
        time.sleep(0.1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_answered_request_is_its_own_stored_row(
    tmp_path: Path, pg_engine: Engine, postgres_url: str, case: str
) -> None:
    uwsgi = require_tool("uwsgi", "pip install -e '.[servers]' (built from source: a C compiler)")
    shutil.copy(APP, tmp_path / "traced_app.py")
    port = free_port()
    fifo = tmp_path / "master.fifo"
    env = traced_env(tmp_path, TRACED_APP_DATABASE_URL=postgres_url)
    options, stop, apps = CASES[case]
    command = [uwsgi, "--master", *options, "--http-socket", f"127.0.0.1:{port}"]
    command += ["--wsgi-file", str(tmp_path / "traced_app.py"), "--need-app"]
    command += ["--virtualenv", sys.prefix, "--master-fifo", str(fifo), "--disable-logging"]
    with Server(command, cwd=tmp_path, env=env, log=tmp_path / "uwsgi.log") as server:
        wait_ready(port, server)
        # Every worker has the application before the load (a graceful shutdown reaching a
        # --lazy-apps worker still loading it leaves the master waiting for that worker forever).
        wait_logged(server, APP_READY, apps)
        load = Load(port, case, CLIENTS, PER_CLIENT, alive=server.alive)
        load.run()
        assert server.alive(), server.output()[-3000:]
        assert (len(load.answers), load.unanswered) == (CLIENTS * PER_CLIENT, 0), (
            f"{len(load.answers)} answered, {load.unanswered} unanswered\n{server.output()[-3000:]}"
        )
        if stop == "sigterm":
            server.stop(signal.SIGTERM, 120, "uWSGI")
        else:
            # uWSGI 2.0's graceful shutdown (SIGINT and SIGQUIT kill the workers at once,
            # SIGTERM reloads them unless --die-on-term). Not blocking: with nobody reading
            # the FIFO, opening it to write would wait forever.
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(descriptor, b"q")
            finally:
                os.close(descriptor)
            server.wait(120, "uWSGI did not end within 120 s of its graceful shutdown")
    stderr = server.output()
    assert server.returncode == 0, stderr[-3000:]
    # uWSGI's sys.executable is uWSGI itself: the workers' storage processes start with the
    # environment's Python all the same (the default with Postgres), not the writer thread.
    assert "from the writer thread in this process instead" not in stderr, stderr[-3000:]
    outcome, references = check(pg_engine, postgres_url, load.answers, stderr, env)
    # uWSGI's SIGTERM with --die-on-term stops each worker at once (SIGINT, then exit() from
    # C): a worker still closing its last request skips Python's atexit, and what it held is
    # said by the next tracer process, exactly. The graceful stops keep everything.
    problems = outcome.counted_problems() if stop == "sigterm" else outcome.storage_up_problems()
    assert not problems, outcome.report(problems, stderr, references)
