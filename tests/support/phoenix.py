"""A real Arize Phoenix server for the tests, started on 127.0.0.1.

Phoenix pins SQLAlchemy 2.1, which recalltrace does not support yet, so it cannot share the
test environment: it is installed once into a virtual environment of its own under the user's
cache (``~/.cache/recalltrace-tests``), or taken from ``$RECALLTRACE_TEST_PHOENIX`` (the path
of a ``phoenix`` executable). Under ``CI=true`` a Phoenix that cannot be installed fails the
test; elsewhere it skips it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

PHOENIX_REQUIREMENT = "arize-phoenix>=20,<21"


def _unavailable(problem: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Phoenix is required under CI=true: {problem}")
    pytest.skip(problem)


def phoenix_executable() -> Path:
    """The ``phoenix`` command, installed on first use."""
    given = os.environ.get("RECALLTRACE_TEST_PHOENIX")
    if given:
        return Path(given)
    folder = Path.home() / ".cache" / "recalltrace-tests" / "phoenix-20"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One install at a time (xdist workers, parallel runs): the others wait for it and find it.
    with open(folder.parent / "phoenix-20.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _installed(folder)


def _installed(folder: Path) -> Path:
    executable = folder / "bin" / "phoenix"
    done = folder / ".installed"
    if executable.exists() and done.exists():
        return executable
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(folder)], capture_output=True, text=True
    )
    if made.returncode != 0:
        _unavailable(f"cannot create a virtual environment for Phoenix: {made.stderr[-500:]}")
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    installed = subprocess.run(
        [*pip, PHOENIX_REQUIREMENT], capture_output=True, text=True, timeout=900
    )
    if installed.returncode != 0 or not executable.exists():
        _unavailable(f"cannot install {PHOENIX_REQUIREMENT}: {installed.stderr[-800:]}")
    done.touch()
    return executable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PhoenixServer:
    """``phoenix serve`` on free loopback ports with a working directory of its own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = workdir / "phoenix.log"

    def __enter__(self) -> PhoenixServer:
        executable = phoenix_executable()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
        env.update(
            PHOENIX_WORKING_DIR=str(self.workdir),
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(self.port),
            PHOENIX_GRPC_PORT=str(_free_port()),
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(executable), "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"Phoenix exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise AssertionError(f"Phoenix did not start: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    @property
    def traces_endpoint(self) -> str:
        """Phoenix's OTLP/HTTP trace receiver."""
        return self.url + "/v1/traces"

    def spans(self, project: str, *, expect: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The project's spans once at least ``expect`` arrived (Phoenix ingests
        asynchronously); fails after ``timeout`` seconds with what it has."""
        deadline = time.monotonic() + timeout
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                found = self.get(f"/v1/projects/{project}/spans", limit=1000)["data"]
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # the project appears with its first span
                    raise
            if len(found) >= expect:
                return found
            time.sleep(0.3)
        raise AssertionError(f"Phoenix has {len(found)} spans of {project}, expected {expect}")

    def get(self, path: str, **query: Any) -> Any:
        """GET a REST API path (lists in ``query`` repeat the parameter) as JSON."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
