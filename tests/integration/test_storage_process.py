"""Storing through a child process (``storage_process=True``) against a real Postgres: the
child dying, hanging or being signalled loses and doubles nothing, its failures reach the
writer as the kinds it already handles, and it never outlives its application."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine, text

import recalltrace
from recalltrace._storage_process import StorageProcessSink
from recalltrace.storage.errors import is_database_unavailable, is_schema_missing
from recalltrace.storage.records import ReferenceUpdate
from recalltrace.tracer._writer import is_trace_not_found
from tests.support.factories import make_trace
from tests.support.postgres import empty_database

ROOT = Path(__file__).resolve().parents[2]


@recalltrace.rag("process-bot")
def answer(question: str) -> str:
    return f"answer to {question}"


def _count(engine: Engine, table: str = "traces") -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _wait_for(condition: Any, what: str, limit: float = 60.0) -> None:
    """Poll ``condition``; the limit only turns a hang into a failure."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {limit:g} s")
        time.sleep(0.05)


def storage_children(parent: int) -> list[int]:
    """The live storage processes started by ``parent``, as ``ps`` would show them."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat[0] != "Z" and int(stat[1]) == parent and b"recalltrace._storage_process" in command:
            found.append(int(entry.name))
    return found


def _storage_pid() -> int:
    """The storage process of the configured tracer's sink (a live child of this process; a
    process an earlier test left may be a child too, so the sink says which is its own)."""
    from recalltrace.tracer import _runtime

    pid = int(getattr(_runtime.get().writer._sink, "helper_pid", 0))
    assert pid in storage_children(os.getpid()), (pid, storage_children(os.getpid()))
    return pid


@pytest.fixture
def through_process(postgres_url: str, pg_engine: Engine) -> Iterator[Engine]:
    recalltrace.configure(
        database_url=postgres_url,
        storage_process=True,
        tracer_provider=TracerProvider(),
        flush_interval=0.05,
        retry_backoff=0.05,
        shutdown_timeout=10,
    )
    yield pg_engine
    recalltrace.shutdown(10)


def test_a_killed_storage_process_is_replaced_and_nothing_is_lost_or_doubled(
    through_process: Engine,
) -> None:
    before = recalltrace.ledger()
    for i in range(30):
        answer(f"before {i}")
    assert recalltrace.flush(60)
    first = _storage_pid()
    os.kill(first, signal.SIGKILL)
    _wait_for(lambda: not _alive(first), "the killed storage process to end")
    for i in range(30):
        answer(f"after {i}")
    assert recalltrace.flush(60)
    second = _storage_pid()
    assert second != first
    ledger = recalltrace.ledger()
    assert (ledger.seen - before.seen, ledger.stored - before.stored) == (60, 60)
    assert ledger.dropped == before.dropped
    assert _count(through_process) == 60


def test_a_storage_process_killed_inside_a_write_has_its_batch_written_once(
    through_process: Engine,
) -> None:
    before = recalltrace.ledger()
    answer("warm-up")
    assert recalltrace.flush(60)
    first = _storage_pid()
    # Hold the traces table so the child's next COPY waits inside its transaction.
    blocker = through_process.connect()
    blocker.execute(text("LOCK TABLE traces IN ACCESS EXCLUSIVE MODE"))
    try:
        for i in range(20):
            answer(f"question {i}")
        _wait_for(
            lambda: _waiting_on_lock(through_process),
            "the storage process to wait on the locked table",
        )
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: not _alive(first), "the killed storage process to end")
    finally:
        blocker.rollback()
        blocker.close()
    assert recalltrace.flush(60)
    assert _storage_pid() != first
    assert _count(through_process) == 21
    ledger = recalltrace.ledger()
    assert (ledger.seen - before.seen, ledger.stored - before.stored) == (21, 21)
    with through_process.connect() as conn:
        jobs = conn.execute(
            text("SELECT count(*), count(DISTINCT (trace_id, metric)) FROM scoring_jobs")
        ).one()
    assert jobs[0] == jobs[1], "no scoring job written twice"


def _waiting_on_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            ).scalar_one()
        )


def test_a_hung_storage_process_is_abandoned_after_the_reply_timeout(
    postgres_url: str, pg_engine: Engine
) -> None:
    sink = StorageProcessSink(postgres_url, reply_timeout=2.0)
    record = make_trace()
    blocker = pg_engine.connect()
    blocker.execute(text("LOCK TABLE traces IN ACCESS EXCLUSIVE MODE"))
    try:
        with pytest.raises(ConnectionError) as raised:
            sink.write_traces([record])
        assert "did not answer within 2 s" in str(raised.value)
        assert is_database_unavailable(raised.value), "retried as it is, attempts not used"
    finally:
        blocker.rollback()
        blocker.close()
    sink.write_traces([record])  # a new child; the first one was killed
    sink.write_traces([record])  # a resend is stored once
    sink.dispose()
    assert _count(pg_engine) == 1


def test_failures_reach_the_writer_as_the_kinds_it_handles(postgres_url: str) -> None:
    record = make_trace()
    unreachable = StorageProcessSink("postgresql+psycopg://postgres@127.0.0.1:1/none")
    try:
        with pytest.raises(Exception) as raised:
            unreachable.write_traces([record])
        assert is_database_unavailable(raised.value)
        assert not is_schema_missing(raised.value)
    finally:
        unreachable.dispose()

    found = StorageProcessSink(postgres_url)
    try:
        with pytest.raises(Exception) as raised:
            found.attach_reference(ReferenceUpdate(trace_id="c" * 32, reference="x"))
        assert is_trace_not_found(raised.value)
        assert not is_database_unavailable(raised.value)
    finally:
        found.dispose()


def test_a_database_without_tables_keeps_the_records_until_they_exist() -> None:
    with empty_database("rt_process_no_tables") as url:
        sink = StorageProcessSink(url, create_schema=False)
        try:
            with pytest.raises(Exception) as raised:
                sink.write_traces([make_trace()])
            assert is_schema_missing(raised.value)
            assert not is_database_unavailable(raised.value)
        finally:
            sink.dispose()


_APP = textwrap.dedent(
    """
    import os, sys, time
    import recalltrace

    # A long interval: what is asked after the flush waits in the queue until the end.
    recalltrace.configure(database_url=sys.argv[1], storage_process=True,
                          flush_interval=600, shutdown_timeout=30)

    @recalltrace.rag("signalled-app")
    def answer(question):
        return "ok"

    for i in range(200):
        answer(f"question {i}")
    recalltrace.flush(60)
    print(os.getpid(), flush=True)
    sys.stdin.readline()  # the test has found the storage process
    for i in range(200, 400):
        answer(f"question {i}")
    print("asked", flush=True)
    if sys.argv[2] == "exit":
        os._exit(0)
    time.sleep(120)
    """
)


def _start_app(url: str, how: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _APP, url, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert int(proc.stdout.readline()) == proc.pid
    (child,) = storage_children(proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "asked"
    return proc, child


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_whole_process_group_stores_everything_first(
    postgres_url: str, pg_engine: Engine, sig: signal.Signals
) -> None:
    proc, child = _start_app(postgres_url, "wait")
    os.killpg(proc.pid, sig)  # as systemd, a terminal's Ctrl-C or `kill -- -PGID` does
    proc.wait(timeout=120)
    _wait_for(lambda: not _alive(child), "the storage process to end after its application")
    assert _count(pg_engine) == 400


def test_an_application_ending_with_os_exit_drains_through_its_storage_process_first(
    postgres_url: str, pg_engine: Engine
) -> None:
    proc, child = _start_app(postgres_url, "exit")
    proc.wait(timeout=120)
    _wait_for(lambda: not _alive(child), "the storage process to end after its application")
    # os._exit drains the queue first (before, the 200 still queued were lost, uncounted).
    assert _count(pg_engine) == 400


def test_the_storage_process_ends_with_an_application_that_is_killed(
    postgres_url: str, pg_engine: Engine
) -> None:
    proc, child = _start_app(postgres_url, "wait")
    proc.kill()
    proc.wait(timeout=120)
    _wait_for(lambda: not _alive(child), "the storage process to end after its application")
    # What was handed over before the kill is stored; the rest was still in the app's queue.
    assert _count(pg_engine) == 200


def test_storage_process_with_a_sink_is_refused() -> None:
    class Sink:
        def write_traces(self, records: Any) -> None:
            raise AssertionError("never called")

        def attach_reference(self, update: Any) -> int:
            raise AssertionError("never called")

    with pytest.raises(ValueError, match="storage_process"):
        recalltrace.configure(sink=Sink(), storage_process=True)


def test_storage_process_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from recalltrace.tracer import TracerConfig

    monkeypatch.setenv("RECALLTRACE_STORAGE_PROCESS", "1")
    assert TracerConfig.from_env().storage_process is True


def test_the_writer_thread_holds_no_lock_while_the_child_works(through_process: Engine) -> None:
    """Requests keep being accepted while the storage process is stuck in a write."""
    answer("warm-up")
    assert recalltrace.flush(60)
    blocker = through_process.connect()
    blocker.execute(text("LOCK TABLE traces IN ACCESS EXCLUSIVE MODE"))
    try:
        answer("held back")
        _wait_for(lambda: _waiting_on_lock(through_process), "the child to wait on the lock")
        done = threading.Event()

        def ask_more() -> None:
            for i in range(50):
                answer(f"while stuck {i}")
            done.set()

        threading.Thread(target=ask_more, daemon=True).start()
        _wait_for(done.is_set, "requests to finish while the child is stuck")
    finally:
        blocker.rollback()
        blocker.close()
    assert recalltrace.flush(60)
    assert _count(through_process) == 52


def test_a_batch_crosses_to_the_storage_process_unchanged() -> None:
    """Every field of a record (new ones included: the encoding follows the dataclass) comes
    back equal, the start time exactly; a value marshal cannot carry sends the batch pickled."""
    from datetime import datetime, timezone

    from recalltrace._storage_process import decode_batch, encode_batch
    from recalltrace.storage.records import ContextRecord, TraceRecord

    full = TraceRecord(
        trace_id="e" * 32,
        app_name="app",
        service_name="svc",
        started_at=datetime(2026, 11, 26, 17, 59, 58, 123457, tzinfo=timezone.utc),
        duration_ms=12.5,
        user_input="question",
        response="answer",
        retrieved_contexts=[
            ContextRecord("text", "kb-1", 0.5, {"source": "a.md", "nested": {"n": [1, 2.5]}}),
            ContextRecord("more", None, None, {}),
        ],
        reference="ref",
        reference_contexts=["ctx"],
        reference_context_ids=["kb-1"],
        metadata={"tier": "pro", "n": 10**30},
        error=True,
        notes=["a note"],
        otel_trace_id="1" * 32,
        otel_span_id="2" * 16,
        release="v1",
        environment="prod",
        user_id="u",
        session_id="s",
        tags=["t1", "t2"],
    )
    plain = make_trace()
    encoded = encode_batch([full, plain])
    assert encoded[:1] == b"M"
    assert decode_batch(encoded) == [full, plain]

    class Custom:
        def __reduce__(self) -> Any:
            return (str, ("custom",))

    odd = make_trace()
    odd.metadata = {"value": Custom()}
    encoded = encode_batch([plain, odd])
    assert encoded[:1] == b"P"
    assert [r.trace_id for r in decode_batch(encoded)] == [plain.trace_id, odd.trace_id]


def _stored_through_process(
    url: str,
    engine: Engine,
    app: str,
    question: str,
    scrubbing: recalltrace.ScrubbingOptions,
) -> tuple[str, list[str]]:
    """``question`` asked of ``app`` and stored through a storage process with ``scrubbing``:
    the stored question and notes."""
    recalltrace.configure(
        database_url=url,
        storage_process=True,
        tracer_provider=TracerProvider(),
        flush_interval=0.05,
        scrubbing=scrubbing,
    )
    try:
        recalltrace.rag(app)(lambda question: "ok")(question)
        assert recalltrace.flush(60)
    finally:
        recalltrace.shutdown(10)
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT user_input, notes FROM traces WHERE app_name = :app"), {"app": app}
        ).one()
    return row[0], list(row[1] or [])


def test_the_storage_process_scrubs_with_the_tracers_options(
    postgres_url: str, pg_engine: Engine
) -> None:
    """The child scrubs each record before it stores it, with the options given to
    ``configure`` (the application's interpreter no longer runs the rules)."""
    question, notes = _stored_through_process(
        postgres_url,
        pg_engine,
        "scrubbed-in-child",
        "my code is zebra-4242, my mail ann@example.org",
        recalltrace.ScrubbingOptions(extra_patterns=[r"zebra-\d+"], replacement="[GONE]"),
    )
    assert question == "my code is [GONE], my mail [GONE]"
    assert any("user_input" in note for note in notes), notes


def test_a_scrubbing_callback_still_runs_in_the_application(
    postgres_url: str, pg_engine: Engine
) -> None:
    """A callback is the application's code: with one, the records are scrubbed in the
    application's process as without a storage process."""
    seen: list[tuple[int, str]] = []

    def keep_domain(match: recalltrace.ScrubMatch) -> str | None:
        seen.append((os.getpid(), match.value))
        return "someone@" + match.value.split("@", 1)[1] if "@" in match.value else None

    question, _notes = _stored_through_process(
        postgres_url,
        pg_engine,
        "callback-in-app",
        "write to ann@example.org",
        recalltrace.ScrubbingOptions(callback=keep_domain),
    )
    assert question == "write to someone@example.org"
    assert seen == [(os.getpid(), "ann@example.org")]


def test_the_storage_process_keeps_its_long_lived_objects_out_of_collections(
    postgres_url: str, pg_engine: Engine
) -> None:
    """After its first write the child's driver, SQLAlchemy and compiled statements sit in the
    collector's permanent generation, so its full collections scan only what a batch makes;
    records written after that are stored as before."""
    sink = StorageProcessSink(postgres_url)
    first, second = make_trace(), make_trace()
    try:
        sink.write_traces([first])
        after_first = sink.status()
        sink.write_traces([second])
        after_second = sink.status()
    finally:
        sink.dispose()
    assert after_first["pid"] != os.getpid()
    assert after_first["frozen"] > 20 * after_first["tracked"], after_first
    # Frozen once: a later write moves nothing more there (frozen objects freed by reference
    # counting leave it).
    assert after_second["frozen"] <= after_first["frozen"], (after_first, after_second)
    with pg_engine.connect() as conn:
        stored = conn.execute(
            text("SELECT count(*) FROM traces WHERE trace_id IN (:a, :b)"),
            {"a": first.trace_id, "b": second.trace_id},
        ).scalar_one()
    assert stored == 2


def test_the_application_loads_no_database_stack_with_a_storage_process(
    postgres_url: str,
) -> None:
    """Stored through the child, the application's process never imports SQLAlchemy or the
    driver: none of their objects sit in its heap for its garbage collections to scan."""
    script = textwrap.dedent(
        f"""
        import sys
        import recalltrace

        recalltrace.configure(
            database_url={postgres_url!r}, storage_process=True, sample_rate=1.0,
            service_name="heap-check",
        )

        @recalltrace.rag("heap-bot")
        def answer(question):
            return "an answer to " + question

        answer("what is kept?")
        assert recalltrace.flush(60)
        assert recalltrace.ledger().stored == 1, recalltrace.ledger()
        loaded = sorted(
            name for name in sys.modules if name.split(".")[0] in ("sqlalchemy", "psycopg")
        )
        print("LOADED", loaded)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED []" in done.stdout, done.stdout


def test_the_storage_process_keeps_none_of_the_applications_descriptors(
    postgres_url: str, pg_engine: Engine
) -> None:
    """A server's own pipes and sockets end when the server closes them, storage process or
    not: uWSGI's threaded workers stop on the end of a pipe whose writing end they close, and a
    copy held by the storage process kept them waiting until it exited (at the application's
    exit, which waited for them)."""
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    os.set_inheritable(write_end, True)  # as uWSGI's pipe(): no close-on-exec
    sink = StorageProcessSink(postgres_url)
    try:
        sink.write_traces([make_trace()])
        child = sink.helper_pid
        assert child
        held = {os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")}
        ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (read_end, write_end)}
        assert not held & ours, held
        os.close(write_end)
        os.set_blocking(read_end, False)
        assert os.read(read_end, 1) == b""  # the end of the pipe, not "would block"
    finally:
        os.close(read_end)
        sink.dispose()
