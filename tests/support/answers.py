"""What real servers, workers and programs answered, checked against the rows stored.

Each traced request carries a token of its own as its question and hands back the record id it
was traced under (``recalltrace.current_trace_id()``) and the pid of the process that served
it: an :class:`Answer`. :func:`check` compares those answers with the ``traces`` table and the
lines the processes said on stderr, and attaches a late reference (the token again) to every
answered id from a separate configured process (``reference_program.py``), so that each stored
row can be checked to be the request that logged its id, with its own reference.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.support import ROOT
from tests.support.ledger import said_dropped, said_lost

REFERENCE_PROGRAM = Path(__file__).with_name("reference_program.py")
RUN_DIR_VARIABLE = "RECALLTRACE_RUN_DIR"


@dataclass(frozen=True)
class Answer:
    """One request as its caller saw it answered."""

    token: str
    trace_id: str | None
    pid: int

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Answer:
        trace_id = value.get("trace_id")
        return cls(
            str(value["token"]), None if trace_id is None else str(trace_id), int(value["pid"])
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_tool(name: str, hint: str) -> str:
    """The path of the executable ``name``: skipped when missing, failed under ``CI=true``."""
    beside = Path(sys.executable).with_name(name)
    path = str(beside) if beside.exists() else shutil.which(name)
    if path is None:
        message = f"{name} is not installed ({hint})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}; it is required under CI=true")
        pytest.skip(message)
    return path


def traced_env(tmp_path: Path, *, importable: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a traced subprocess: none of the test run's ``RECALLTRACE_*``
    settings, and a run directory of its own (``RECALLTRACE_RUN_DIR``), so that the processes
    of one test never see those of another; ``importable`` goes first on ``PYTHONPATH``."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env[RUN_DIR_VARIABLE] = str(run_dir)
    if importable is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(importable), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def ask(port: int, path: str, timeout: float = 20.0) -> tuple[int, bytes] | None:
    """(status, body) of one GET on a new connection, None when no answer came."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None


def ask_traced(port: int, token: str, timeout: float = 20.0) -> Answer | None:
    """One traced request (``/ask?q=TOKEN``); its answer, None when none came."""
    got = ask(port, f"/ask?q={token}", timeout)
    if got is None or got[0] != 200:
        return None
    try:
        return Answer.from_json(json.loads(got[1]))
    except (ValueError, KeyError, TypeError):
        return None


class Server:
    """A server started in a session of its own (so that its workers can be killed with it),
    everything it writes going to a file: a pipe nobody reads while the load runs could fill
    and stall it. Used as a context manager, whatever is left of it is killed on the way out."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.process.pid

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, signum: int, seconds: float, name: str) -> int:
        """Send ``signum`` and wait for the server to end; fails after ``seconds``."""
        self.process.send_signal(signum)
        return self.wait(
            seconds, f"{name} did not end within {seconds:g} s of {signal.Signals(signum).name}"
        )

    def wait(self, seconds: float, failure: str) -> int:
        """Wait for the server to end; after ``seconds``, fail saying ``failure``."""
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{failure}\n{self.output()[-3000:]}") from exc

    def kill(self) -> None:
        """SIGKILL the whole group (the workers too, also those whose leader ended first)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)


def wait_ready(port: int, server: Server, seconds: float = 60.0) -> None:
    """Wait until the server answers its untraced ``/ping``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not server.alive():
            raise AssertionError(f"the server ended at start-up: {server.output()[-3000:]}")
        got = ask(port, "/ping", timeout=5)
        if got is not None and got[0] == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"the server did not start: {server.output()[-3000:]}")


@dataclass
class Load:
    """Traced requests from client threads, each on a new connection; ``on_answer`` is called
    with every answer (outside the lock). A client stops after ``give_up`` requests in a row
    got no answer, or when ``alive()`` says the server ended."""

    port: int
    prefix: str
    clients: int
    per_client: int
    timeout: float = 20.0
    give_up: int = 2
    alive: Callable[[], bool] = lambda: True
    on_answer: Callable[[Answer], None] | None = None
    answers: list[Answer] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    unanswered: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, join_seconds: float = 240.0) -> None:
        threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True)
            for n in range(self.clients)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + join_seconds
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.1))

    def _client(self, number: int) -> None:
        missed = 0
        for sent in range(self.per_client):
            token = f"{self.prefix}-c{number}-n{sent}"
            with self._lock:
                self.sent.append(token)
            answer = ask_traced(self.port, token, self.timeout)
            if answer is None:
                with self._lock:
                    self.unanswered += 1
                missed += 1
                if missed >= self.give_up or not self.alive():
                    return
                continue
            missed = 0
            with self._lock:
                self.answers.append(answer)
            if self.on_answer is not None:
                self.on_answer(answer)


def gunicorn_options() -> list[str]:
    """Options every test gunicorn gets: no control socket where gunicorn has one (its default
    path is shared by every gunicorn of the user, so parallel tests would take it in turns)."""
    from gunicorn.config import KNOWN_SETTINGS

    if any(setting.name == "control_socket_disable" for setting in KNOWN_SETTINGS):
        return ["--no-control-socket"]
    return []


def children(pid: int) -> set[int]:
    """The pids of the processes ``pid`` started that are still running (Linux ``/proc``)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(child) for child in (task / "children").read_text().split())
    return found


def read_answer_lines(lines: Iterable[str]) -> list[Answer]:
    """Answers written one JSON object a line (blank lines skipped)."""
    return [Answer.from_json(json.loads(line)) for line in lines if line.strip()]


def read_answer_files(folder: Path) -> list[Answer]:
    answers: list[Answer] = []
    for path in sorted(folder.glob("*.jsonl")):
        answers += read_answer_lines(path.read_text().splitlines())
    return answers


@dataclass(frozen=True)
class Row:
    user_input: str | None
    reference: str | None


def stored_rows(engine: Engine) -> dict[str, Row]:
    with engine.connect() as conn:
        result = conn.execute(text("SELECT trace_id, user_input, reference FROM traces"))
        return {str(tid): Row(user_input, reference) for tid, user_input, reference in result}


def attach_references(
    database_url: str, answers: Iterable[Answer], env: dict[str, str], wait: float = 5.0
) -> str:
    """Attach each answer's token as the late reference of its record id, from a configured
    process of its own; its stderr (which may say what other processes ended holding)."""
    pairs = [[a.trace_id, a.token] for a in answers if a.trace_id]
    done = subprocess.run(
        [sys.executable, str(REFERENCE_PROGRAM), database_url, str(wait)],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@dataclass
class Outcome:
    """What was answered, what was stored, and what the processes said."""

    answered: int
    distinct_ids: int
    ids_in_several_processes: int
    ids_answered_twice: int
    stored: int
    rows_not_their_request: int
    rows_never_asked: int
    tokens_stored_twice: int
    answered_not_stored: int
    said_dropped: int
    said_lost: int
    references_not_own: int

    def summary(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in vars(self).items())

    def report(self, problems: list[str], stderr: str, references: str) -> str:
        """An assertion message: the problems, the counts, and the tails of both stderrs."""
        return (
            f"{problems}\n{self.summary()}\n--- the processes' stderr:\n{stderr[-2000:]}\n"
            f"--- the reference process's stderr:\n{references[-1000:]}"
        )

    def storage_up_problems(self) -> list[str]:
        """Storage was up the whole time: every answered request is its own stored row, with
        its own reference, and nothing was given up."""
        problems = []
        if self.stored + self.said_dropped + self.said_lost != self.answered:
            problems.append(
                f"ledger: {self.stored} stored + {self.said_dropped} said dropped + "
                f"{self.said_lost} said lost != {self.answered} answered"
            )
        if (self.stored, self.said_dropped, self.said_lost) != (self.answered, 0, 0):
            problems.append(
                f"{self.answered_not_stored} answered request(s) not stored, "
                f"{self.said_dropped + self.said_lost} said dropped or lost"
            )
        problems += self.identity_problems()
        return problems

    def counted_problems(self) -> list[str]:
        """A process may have ended without running Python code (a server that stops its
        workers at once): every answered request is its own stored row, or one of the records
        a tracer process said that process lost, exactly; nothing given up otherwise."""
        problems = []
        if self.stored + self.said_lost != self.answered or self.said_dropped:
            problems.append(
                f"ledger: {self.stored} stored + {self.said_lost} said lost (+ "
                f"{self.said_dropped} said dropped) != {self.answered} answered"
            )
        if self.answered_not_stored != self.said_lost:
            problems.append(
                f"{self.answered_not_stored} answered request(s) not stored, "
                f"{self.said_lost} said lost"
            )
        problems += self.identity_problems()
        return problems

    def identity_problems(self) -> list[str]:
        problems = []
        if self.distinct_ids != self.answered:
            problems.append(
                f"{self.answered} answers carried {self.distinct_ids} distinct record ids "
                f"({self.ids_in_several_processes} id(s) drawn in several processes)"
            )
        if self.rows_not_their_request:
            problems.append(
                f"{self.rows_not_their_request} stored row(s) hold another request than the one "
                "that logged their id"
            )
        if self.tokens_stored_twice:
            problems.append(f"{self.tokens_stored_twice} request(s) stored twice")
        if self.references_not_own:
            problems.append(
                f"{self.references_not_own} stored row(s) without their own late reference"
            )
        return problems


def check(
    engine: Engine,
    database_url: str,
    answers: list[Answer],
    stderr: str,
    env: dict[str, str],
    sent_tokens: Iterable[str] = (),
) -> tuple[Outcome, str]:
    """Compare ``answers`` with the stored rows and the lines in ``stderr``, attach every
    answered id's late reference, and compare again; the outcome, and the stderr of the
    reference process (its lines are counted in the outcome too)."""
    by_id: dict[str, list[Answer]] = defaultdict(list)
    for answer in answers:
        by_id[answer.trace_id or ""].append(answer)
    rows = stored_rows(engine)
    asked = {a.token for a in answers} | set(sent_tokens)
    tokens = Counter(row.user_input for row in rows.values())
    not_their_request = 0
    for trace_id, row in rows.items():
        owners = by_id.get(trace_id, [])
        if owners and (len(owners) != 1 or owners[0].token != row.user_input):
            not_their_request += 1
    answered_tokens_stored = sum(1 for a in answers if tokens.get(a.token))
    references_stderr = attach_references(database_url, answers, env)
    after = stored_rows(engine)
    references_not_own = sum(
        1 for tid, row in after.items() if tid in by_id and row.reference != row.user_input
    )
    outcome = Outcome(
        answered=len(answers),
        distinct_ids=len({a.trace_id for a in answers if a.trace_id}),
        ids_in_several_processes=sum(
            1 for owners in by_id.values() if len({a.pid for a in owners}) > 1
        ),
        ids_answered_twice=sum(1 for owners in by_id.values() if len(owners) > 1),
        stored=len(rows),
        rows_not_their_request=not_their_request,
        rows_never_asked=sum(1 for row in rows.values() if row.user_input not in asked),
        tokens_stored_twice=sum(1 for count in tokens.values() if count > 1),
        answered_not_stored=len(answers) - answered_tokens_stored,
        # The reference process's own drop lines are of references (reference_not_found), not
        # of requests; what it says other processes ended holding is counted.
        said_dropped=said_dropped(stderr),
        said_lost=said_lost(stderr + references_stderr),
        references_not_own=references_not_own,
    )
    return outcome, references_stderr


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL what is left of a process started with ``start_new_session=True`` (its whole
    group: the processes it forked too)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
        process.communicate(timeout=30)
