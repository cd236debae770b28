"""A process killed while it holds records leaves their number behind, and the next tracer
process says it: the records a process holds are counted in its ledger file as they are queued.

Before, a process ended by SIGKILL (a server's timeout, the OOM killer) took its counts with it
and nothing was ever said of the records it held.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from tests.support.ledger import said_lost

HOLDER = """
import sys, time
import recalltrace

# A database nobody answers on: the records stay queued (bounded), as during an outage.
recalltrace.configure(
    database_url="postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=1",
    sample_rate=1.0,
    service_name="holder",
)

@recalltrace.rag
def answer(question):
    return "ok"

for number in range(int(sys.argv[1])):
    answer(f"q{number}")
print("held", flush=True)
time.sleep(600)
"""

NEXT = """
import sys
import recalltrace

recalltrace.configure(database_url=sys.argv[1], sample_rate=1.0, service_name="next")

@recalltrace.rag
def answer(question):
    return "ok"

answer("after")
assert recalltrace.flush(30)
print(recalltrace.ledger().lost_by_ended_processes, flush=True)
"""


def _env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["RECALLTRACE_RUN_DIR"] = str(run_dir)
    return env


def test_the_records_a_killed_process_held_are_said_by_the_next_process(
    tmp_path: Path, sqlite_url: str
) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "37"],
        cwd=ROOT,
        env=_env(run_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        files = list(run_dir.glob(f"{holder.pid}-*.ledger"))
        assert len(files) == 1, list(run_dir.iterdir())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    # Its file outlives it.
    assert files[0].exists()
    # `recalltrace doctor` reads it before anyone claims it.
    doctor = subprocess.run(
        [
            sys.executable,
            "-m",
            "recalltrace",
            "doctor",
            "--run-dir",
            str(run_dir),
            "--database-url",
            sqlite_url,
        ],
        cwd=tmp_path,
        env=_env(run_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert doctor.returncode == 0, doctor.stderr
    assert f"process {holder.pid} ended holding 37 record(s)" in doctor.stdout, doctor.stdout
    # The next tracer process with the same run directory claims it, says it once, counts it.
    url = f"sqlite:///{tmp_path / 'next.db'}"
    done = subprocess.run(
        [sys.executable, "-c", NEXT, url],
        cwd=ROOT,
        env=_env(run_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert said_lost(done.stderr) == 37, done.stderr
    assert re.search(rf"process {holder.pid} ended holding 37 record\(s\)", done.stderr)
    assert "37 were never written" in done.stderr
    assert done.stdout.strip() == "37"
    assert not files[0].exists()
    # Said once: a third process finds nothing more, and doctor shows it as found.
    again = subprocess.run(
        [sys.executable, "-c", NEXT, url],
        cwd=ROOT,
        env=_env(run_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and said_lost(again.stderr) == 0, again.stderr
    doctor = subprocess.run(
        [
            sys.executable,
            "-m",
            "recalltrace",
            "doctor",
            "--run-dir",
            str(run_dir),
            "--database-url",
            url,
        ],
        cwd=tmp_path,
        env=_env(run_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"process {holder.pid} ended holding 37 record(s)" in doctor.stdout
    assert "found by process" in doctor.stdout


def test_a_process_that_ends_through_python_leaves_no_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for ending in ("", "import os; os._exit(0)"):
        program = NEXT + "\n" + ending
        done = subprocess.run(
            [sys.executable, "-c", program, f"sqlite:///{tmp_path / 'db.db'}"],
            cwd=ROOT,
            env=_env(run_dir),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert list(run_dir.glob("*.ledger")) == [], ending
