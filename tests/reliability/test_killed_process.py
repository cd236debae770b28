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

import pytest
from sqlalchemy import Engine, text

from tests.support import ROOT
from tests.support.clocks import wait_until
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
# A process looks for ended ones a moment after its writer starts, and at its end at the latest.
recalltrace.shutdown(30)
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


HELD_IN_A_WRITE = """
import sys, time
import recalltrace

recalltrace.configure(
    database_url=sys.argv[1],
    sample_rate=1.0,
    service_name="holder",
    storage_process=sys.argv[2] == "storage-process",
    max_batch_size=10,
    flush_interval=0.05,
)

@recalltrace.rag
def answer(question):
    return "ok"

answer("warm-up")  # the connection (or the storage process) is there before the write
assert recalltrace.flush(60)
print("ready", flush=True)
sys.stdin.readline()
for number in range(25):
    answer(f"q{number}")
print("asked", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize(
    ("how", "committed"), [("writer-thread", False), ("storage-process", True)]
)
def test_the_batch_a_killed_process_was_writing_is_looked_up_not_guessed(
    tmp_path: Path, postgres_url: str, pg_engine: Engine, how: str, committed: bool
) -> None:
    """Killed in the middle of a write: the file holds the batch's ids, and the next process
    says how many of them the database has. Through the writer thread the killed process's
    transaction dies with it (none stored); through a storage process, which outlives it, the
    write commits once the table is free again (all stored), and the claim waits for that
    process to end first."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HELD_IN_A_WRITE, postgres_url, how],
        cwd=ROOT,
        env=_env(run_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready"
    blocker = pg_engine.connect()
    transaction = blocker.begin()
    blocker.execute(text("LOCK TABLE traces IN ACCESS EXCLUSIVE MODE"))
    try:
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "asked"
        (file,) = run_dir.glob(f"{holder.pid}-*.ledger")
        wait_until(lambda: _in_write(file) == 10, "the holder's first batch to be in a write")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)  # its storage process keeps the pipes open: not communicate()
        transaction.rollback()
        blocker.close()
    url = postgres_url
    done = subprocess.run(
        [sys.executable, "-c", NEXT, url],
        cwd=ROOT,
        env=_env(run_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with pg_engine.connect() as conn:
        stored = int(
            conn.execute(
                text("SELECT count(*) FROM traces WHERE user_input LIKE 'q%'")
            ).scalar_one()
        )
    assert stored == (10 if committed else 0)
    # Exactly the records that are not stored are said lost.
    assert said_lost(done.stderr) == 25 - stored, done.stderr
    if committed:
        assert "0 were in a write that did not commit (and 10 more" in done.stderr
    else:
        assert "10 were in a write that did not commit (and 0 more" in done.stderr


def _in_write(file: Path) -> int:
    import struct

    return int(struct.unpack("=8q", file.read_bytes()[:64])[5])


def test_a_ledger_file_keeps_no_option_of_the_command_line(tmp_path: Path) -> None:
    """What a ledger file says of its process (read by the next process and by doctor) holds
    the program and its command words, not an option's value: ``collect --token SECRET``."""
    run_dir = tmp_path / "run"
    secret = "tok-9f86d081884c7d659a2feaa0c55ad015"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "3", "--token", secret, f"--key={secret}"],
        cwd=ROOT,
        env=_env(run_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        files = list(run_dir.glob("*.ledger"))
        assert files
        for file in files:
            data = file.read_bytes()
            assert b'"argv"' in data
            assert secret.encode() not in data and b"--token" not in data
    finally:
        holder.kill()
        holder.wait()
