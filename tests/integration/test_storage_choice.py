"""Where records are stored from, left to choose (``storage_process`` unset): a storage process
for a process that keeps storing into Postgres, the writer thread for one whose first write is
its last or that stores into SQLite; and a process whose children store from their writer
threads loads the database stack once, before it forks, instead of each child loading it.

Measured (``benchmarks/forked_jobs.py``): a storage process costs a job that forks a process of
its own about half a second; the writer thread tens of milliseconds once the parent loaded the
stack, about 0.3 s more when each child loads it. A busy service keeps more of its speed with
the storage process (``benchmarks/saturation.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

PROGRAM = """
import json, os, sys
import recalltrace
from recalltrace.tracer import _runtime

url, how = sys.argv[1], sys.argv[2]
recalltrace.configure(database_url=url, sample_rate=1.0, service_name="choice")

@recalltrace.rag
def answer(question):
    return "ok"

pipeline = _runtime.get().pipeline
before = pipeline.place("store")
answer("q")
if how == "runs-on":
    assert recalltrace.flush(60)
    print(json.dumps({"before": before, "store": pipeline.place("store"),
                      "sqlalchemy": "sqlalchemy" in sys.modules}), flush=True)
    recalltrace.shutdown(60)
else:  # the first write is the drain of os._exit
    import recalltrace._storage_process as storage_process

    started = storage_process.StorageProcessSink._start

    def said_started(sink):
        print("a storage process was started", file=sys.stderr, flush=True)
        started(sink)

    storage_process.StorageProcessSink._start = said_started
    print(json.dumps({"before": before}), flush=True)
    os._exit(0)
"""


def _python(program: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``program`` run by a new interpreter with ``args``, in an environment without the
    tests' recalltrace settings (its ledger files in ``tmp_path``); it must exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["RECALLTRACE_RUN_DIR"] = str(tmp_path / "run")
    done = subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _run(url: str, how: str, tmp_path: Path) -> dict[str, object]:
    done = _python(PROGRAM, tmp_path, url, how)
    _LAST_STDERR[:] = [done.stderr]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


_LAST_STDERR = [""]


def _count(url: str) -> int:
    from sqlalchemy import text

    from recalltrace.storage.db import create_engine_from_url

    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM traces WHERE service_name = 'choice'")
                ).scalar_one()
            )
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_process_that_runs_on_stores_into_postgres_through_a_storage_process(
    tmp_path: Path, pg_engine: object, postgres_url: str
) -> None:
    seen = _run(postgres_url, "runs-on", tmp_path)
    assert seen == {
        "before": "decided at the first write",
        "store": "storage process",
        "sqlalchemy": False,  # the application never loads the database stack
    }
    assert _count(postgres_url) == 1


@pytest.mark.postgres
def test_a_process_whose_first_write_is_its_end_stores_from_its_writer_thread(
    tmp_path: Path, pg_engine: object, postgres_url: str
) -> None:
    seen, stderr = _run(postgres_url, "ends", tmp_path), _LAST_STDERR[0]
    assert seen["before"] == "decided at the first write"
    assert "a storage process was started" not in stderr
    assert _count(postgres_url) == 1


def test_a_process_storing_into_sqlite_stores_from_its_writer_thread(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'choice.db'}"
    seen = _run(url, "runs-on", tmp_path)
    assert seen["store"] == "writer thread" and seen["sqlalchemy"] is True
    assert _count(url) == 1


FORKING = """
import json, os, sys
import recalltrace

url, choice = sys.argv[1], sys.argv[2]
recalltrace.configure(
    database_url=url, sample_rate=1.0, service_name="choice",
    storage_process={"thread": False, "auto": None}[choice],
)

@recalltrace.rag
def answer(question):
    return "ok"

loaded_before_fork = "sqlalchemy" in sys.modules
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, b"1" if "sqlalchemy" in sys.modules else b"0")
    answer("in the child")
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"before": loaded_before_fork, "child": os.read(read, 1) == b"1"}))
"""


@pytest.mark.postgres
@pytest.mark.parametrize(("choice", "loaded"), [("thread", True), ("auto", False)])
def test_a_process_loads_the_database_stack_before_forking_only_for_writer_threads(
    tmp_path: Path, pg_engine: object, postgres_url: str, choice: str, loaded: bool
) -> None:
    """With the writer thread its children store from, the parent loads the stack once before
    its first fork (each child then only connects); left to choose with a database server, a
    pre-fork server's workers may store through storage processes, and would carry the stack in
    their heaps for nothing: it is not loaded."""
    done = _python(FORKING, tmp_path, postgres_url, choice)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"before": False, "child": loaded}
    assert _count(postgres_url) == 1


# A program that embeds Python (uWSGI, mod_wsgi) sets sys.executable to itself: the storage
# process cannot be started with it. The stand-in here is a program that is not Python at all,
# and an installation with no interpreter in it; then one that ends while starting.
EMBEDDED = """
import json, os, sys
sys.executable, how = sys.argv[1], sys.argv[3]
if how == "no-python":
    sys.prefix = sys.exec_prefix = sys.base_prefix = sys.argv[4]
    sys._base_executable = ""
import recalltrace
from recalltrace.tracer import _runtime

recalltrace.configure(
    database_url=sys.argv[2], sample_rate=1.0, service_name="choice",
    storage_process=True if how == "asked" else None,
)

@recalltrace.rag
def answer(question):
    return "ok: " + question

for n in range(20):
    answer(f"question {n} from alice@example.com")
assert recalltrace.flush(60)
pipeline = _runtime.get().pipeline
print(json.dumps({"store": pipeline.place("store")}), flush=True)
recalltrace.shutdown(60)
"""


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["no-python", "ends-starting", "asked"])
def test_a_storage_process_that_cannot_start_leaves_storing_to_the_writer_thread(
    tmp_path: Path, pg_engine: object, postgres_url: str, how: str
) -> None:
    """Every record is stored, scrubbed, from the writer thread; why is said once."""
    program = tmp_path / "uwsgi"
    if how != "no-python":
        program = tmp_path / "python3"  # looks like Python, ends at once (as uWSGI reading -c)
    program.write_text("#!/bin/sh\necho 'unable to load configuration' >&2\nexit 1\n")
    program.chmod(0o755)
    empty = tmp_path / "installation"
    empty.mkdir()
    done = _python(EMBEDDED, tmp_path, str(program), postgres_url, how, str(empty))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"store": "writer thread"}
    said = [line for line in done.stderr.splitlines() if "from the writer thread" in line]
    assert len(said) == 1, done.stderr[-3000:]
    expected = "is not a Python interpreter" if how == "no-python" else "exited while starting"
    assert expected in said[0], said
    assert _count(postgres_url) == 20
    from sqlalchemy import text

    from recalltrace.storage.db import create_engine_from_url

    engine = create_engine_from_url(postgres_url)
    try:
        with engine.connect() as conn:
            inputs = conn.execute(
                text("SELECT user_input FROM traces WHERE service_name = 'choice'")
            ).scalars()
            assert not [value for value in inputs if "alice@example.com" in value]
    finally:
        engine.dispose()


def test_the_storage_process_starts_with_python_where_sys_executable_is_another_program(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from recalltrace import _storage_process

    monkeypatch.setattr(sys, "executable", str(tmp_path / "uwsgi"))
    found = _storage_process.python_interpreter()
    assert found is not None and os.path.basename(found).startswith("python")
    assert found.startswith((sys.prefix, sys.base_prefix)) or found == sys._base_executable
    # Its version is this one: the compiled modules on sys.path are this version's.
    version = subprocess.run(
        [found, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    assert version == str(sys.version_info[:2])
    for name in ("prefix", "exec_prefix", "base_prefix"):
        monkeypatch.setattr(sys, name, str(tmp_path))
    monkeypatch.setattr(sys, "_base_executable", "", raising=False)
    assert _storage_process.python_interpreter() is None
