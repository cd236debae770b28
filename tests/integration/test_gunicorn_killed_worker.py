"""A gunicorn sync worker SIGKILLed under load: what it held is stored or said lost.

Two sync workers serve four client threads; once a third of the requests are answered, the
worker that answered the last one is sent SIGKILL (what the OOM killer or gunicorn's own
``--timeout`` does) and gunicorn starts a replacement, which serves requests too. gunicorn is
then stopped with SIGTERM, and a separate configured process attaches each answered token as
the late reference of its record id.

The killed worker cannot drain or count what it had accepted and not stored. The next tracer
process writing to the same database (the replacement worker after its first record, or any
other configured process of the host: here also the process attaching references) says it in
one line, ``process PID ended holding N record(s)``, and ``recalltrace doctor`` lists it. So
every answered request is a stored row, a drop said, or one of the records said lost; and
nothing is counted twice: at most the requests in flight on the killed worker when it died
(answered by nobody, perhaps accepted or stored) may be counted beyond the answered ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.answers import (
    Answer,
    Load,
    Server,
    ask_traced,
    check,
    children,
    free_port,
    gunicorn_options,
    traced_env,
    wait_ready,
)
from tests.support.ledger import LOST_LINE, said_lost_by_process

pytest.importorskip("gunicorn")

# The real-system stage (gunicorn under load, a worker killed).
pytestmark = pytest.mark.realsystem

APP = Path(__file__).with_name("traced_app.py")
CLIENTS = 4
PER_CLIENT = 150
KILL_AT = CLIENTS * PER_CLIENT // 3


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "no-preload"])
def test_a_killed_workers_records_are_stored_or_said_lost(
    tmp_path: Path, pg_engine: Engine, postgres_url: str, preload: bool
) -> None:
    shutil.copy(APP, tmp_path / "traced_app.py")
    port = free_port()
    env = traced_env(tmp_path, importable=tmp_path, TRACED_APP_DATABASE_URL=postgres_url)
    command = [sys.executable, "-m", "gunicorn", *(["--preload"] if preload else [])]
    command += ["--workers", "2", "--bind", f"127.0.0.1:{port}", "--timeout", "60"]
    command += ["--graceful-timeout", "60", "--log-level", "warning", *gunicorn_options()]
    command += ["traced_app:application"]
    killed: list[int] = []
    extra: list[Answer] = []
    lock = threading.Lock()
    with Server(command, cwd=tmp_path, env=env, log=tmp_path / "gunicorn.log") as server:

        def on_answer(answer: Answer) -> None:
            with lock:
                if killed or len(load.answers) < KILL_AT:
                    return
                killed.append(answer.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(answer.pid, signal.SIGKILL)

        wait_ready(port, server)
        first_workers = children(server.pid)
        load = Load(
            port, "killed", CLIENTS, PER_CLIENT, give_up=5, alive=server.alive, on_answer=on_answer
        )
        load.run()
        # The replacement worker serves at least one request (it may say what the killed one
        # held after its first record).
        for number in range(300):
            if any(a.pid not in first_workers for a in load.answers + extra):
                break
            load.sent.append(f"after-n{number}")
            answer = ask_traced(port, f"after-n{number}")
            if answer is not None:
                extra.append(answer)
        server.stop(signal.SIGTERM, 120, "gunicorn")
    stderr = server.output()
    assert server.returncode == 0, stderr[-3000:]
    assert killed, f"only {len(load.answers)} answered: no worker was killed\n{stderr[-3000:]}"
    answers = load.answers + extra
    assert len(answers) >= CLIENTS * PER_CLIENT - CLIENTS, stderr[-3000:]
    replacement = sorted({a.pid for a in answers} - first_workers)
    outcome, references = check(pg_engine, postgres_url, answers, stderr, env, load.sent)
    lines = stderr + references
    doctor = subprocess.run(
        [sys.executable, "-m", "recalltrace", "doctor", "--database-url", postgres_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    accounted = outcome.stored + outcome.said_dropped + outcome.said_lost
    said_about = said_lost_by_process(lines)
    problems = []
    if doctor.returncode != 0:
        problems.append(f"recalltrace doctor failed: {doctor.stderr[-1500:]}")
    if not outcome.answered <= accounted <= outcome.answered + CLIENTS:
        problems.append(
            f"ledger: {outcome.stored} stored + {outcome.said_dropped} said dropped + "
            f"{outcome.said_lost} said lost = {accounted}, not within [{outcome.answered}, "
            f"{outcome.answered + CLIENTS}] ({outcome.answered} answered, at most {CLIENTS} in "
            f"flight on the killed worker {killed[0]})"
        )
    if set(said_about) - set(killed):
        problems.append(f"said lost by processes that were not killed: {said_about}")
    if said_about and not any(
        int(pid) == killed[0] for pid, _ in LOST_LINE.findall(doctor.stdout + doctor.stderr)
    ):
        problems.append(
            f"recalltrace doctor does not list the killed worker {killed[0]}: "
            f"{(doctor.stdout + doctor.stderr)[-1500:]}"
        )
    problems += outcome.identity_problems()
    if outcome.rows_never_asked:
        problems.append(f"{outcome.rows_never_asked} stored row(s) of requests never sent")
    assert not problems, (
        f"killed {killed}, replacement {replacement}, unanswered {load.unanswered}\n"
        + outcome.report(problems, stderr, references)
    )
