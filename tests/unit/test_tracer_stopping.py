"""Stopping without losing records silently: bounded flush, counted shutdown, signals."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import recalltrace
from tests.support import ROOT
from tests.support.clocks import HANG_GUARD_S, finishes, wait_until
from tests.support.tracer_helpers import FlakySink, dropped, make_traced


@recalltrace.rag
def answer(question: str) -> str:
    return "ok"


def test_flush_without_a_timeout_gives_up_while_storage_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FlakySink(down=True)
    make_traced(sink, flush_timeout=0.5)
    try:
        for index in range(7):
            answer(f"q{index}")
        with caplog.at_level(logging.WARNING, logger="recalltrace"):
            # Without flush_timeout it would wait for storage to come back: for ever.
            assert finishes(recalltrace.flush, "flush() while storage is down") is False
        lines = [r.getMessage() for r in caplog.records if "flush gave up" in r.getMessage()]
        assert len(lines) == 1
        assert "7 record(s) not stored yet" in lines[0]
        assert "ConnectionError" in lines[0]
    finally:
        sink.down = False
        recalltrace.shutdown(HANG_GUARD_S)


def test_shutdown_while_storage_is_down_counts_and_says_the_exact_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FlakySink(down=True)
    make_traced(sink, flush_interval=0.05)
    before = dropped("shutdown")
    for index in range(50):
        answer(f"q{index}")
    # The writer has taken (some of) them and is retrying against the down sink.
    wait_until(lambda: sink.failures >= 1, "the writer never tried to store")
    with caplog.at_level(logging.WARNING, logger="recalltrace"):
        assert recalltrace.shutdown(0.5) is False
    assert dropped("shutdown") - before == 50
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert any("dropped 50 trace record(s) (shutdown 50)" in line for line in lines), lines


SCRIPT = """
import os, signal, sys, time
import recalltrace

url = sys.argv[1]
mode = sys.argv[2]
if mode == "app-handler":
    def own(signum, frame):
        print("own handler ran", flush=True)
    signal.signal(signal.SIGTERM, own)
recalltrace.configure(
    database_url=url, flush_interval=60.0, sample_rate=1.0, shutdown_timeout=10.0
)
if mode == "inside-the-tracer":
    # The signal arrives while the main thread is inside the tracer, holding the writer's
    # lock (queuing the 25th record): the handler runs right there, in that thread. The
    # queue's append, compiled as one of the tracer's files, sends it.
    import collections
    from recalltrace.tracer import _runtime

    INTERRUPTING = (
        "class Interrupting(collections.deque):\\n"
        "    def append(self, item):\\n"
        "        super().append(item)\\n"
        "        if len(self) == 25:\\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\\n"
        "            for _ in range(1000):\\n"
        "                pass\\n"
    )
    where = os.path.join(os.path.dirname(_runtime.__file__), "_interrupting.py")
    space = {"collections": collections, "os": os, "signal": signal}
    exec(compile(INTERRUPTING, where, "exec"), space)
    writer = _runtime.current.writer
    writer._queue = space["Interrupting"](writer._queue)

@recalltrace.rag
def answer(question):
    return "ok"

for i in range(25):
    answer(f"q{i}")
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("still running", flush=True)
recalltrace.flush(10)
"""


def stored(url: str) -> int:
    from sqlalchemy import func, select

    from recalltrace.storage.db import create_engine_from_url
    from recalltrace.storage.models import Trace

    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        count = int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    engine.dispose()
    return count


def run(tmp_path: Path, mode: str, script: str = SCRIPT) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), url, mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sigterm_with_the_default_action_drains_then_ends_as_before(tmp_path: Path) -> None:
    done = run(tmp_path, "default")
    # Killed by SIGTERM as without recalltrace, and nothing queued was lost.
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "still running" not in done.stdout
    assert stored(f"sqlite:///{tmp_path / 'stop.db'}") == 25


def test_sigterm_arriving_inside_the_tracer_waits_until_it_left_then_drains(
    tmp_path: Path,
) -> None:
    # A pool worker told to stop while it queues a record: the handler interrupts the main
    # thread inside the tracer, holding the lock the drain needs. It is delivered again once
    # the thread left the tracer, and the drain stores everything, instead of waiting out
    # shutdown_timeout for a lock that its own thread holds and losing the queue.
    done = run(tmp_path, "inside-the-tracer")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "still running" not in done.stdout
    # Everything was stored: nothing to warn about (the drain's own line is at INFO).
    assert "recalltrace" not in done.stderr, done.stderr
    assert stored(f"sqlite:///{tmp_path / 'stop.db'}") == 25


def test_sigterm_goes_to_the_applications_own_handler_unchanged(tmp_path: Path) -> None:
    done = run(tmp_path, "app-handler")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["own handler ran", "still running"]
    assert stored(f"sqlite:///{tmp_path / 'stop.db'}") == 25


def test_handle_signals_false_leaves_signals_alone() -> None:
    from recalltrace.tracer import _signals

    make_traced(handle_signals=False)
    original = signal.getsignal(signal.SIGTERM)
    assert original is not _signals._handle
    try:
        make_traced()
        assert signal.getsignal(signal.SIGTERM) is _signals._handle
        make_traced(handle_signals=False)
        assert signal.getsignal(signal.SIGTERM) is original  # given back as it was
    finally:
        recalltrace.shutdown(1)


def test_a_typo_in_recalltrace_metrics_is_refused_at_configure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECALLTRACE_METRICS", "id_based_context_recall,llm_contex_recall")
    with pytest.raises(ValueError, match="unknown metric 'llm_contex_recall'; known metrics"):
        recalltrace.configure(database_url=f"sqlite:///{tmp_path / 'x.db'}")


USER_CODE_INTERRUPTED = """
import os, signal, sys
import recalltrace

# Ctrl-C's default, as in a terminal (a process started in the background inherits SIGINT
# ignored, and Python then leaves it so).
signal.signal(signal.SIGINT, signal.default_int_handler)
recalltrace.configure(database_url=sys.argv[1], flush_interval=60.0, sample_rate=1.0)

@recalltrace.rag
def answer(question):
    # The application's own code, inside a traced call: Ctrl-C reaches it at once, as without
    # recalltrace (the handler holds back only while the tracer's own code runs).
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):
            pass
    except KeyboardInterrupt:
        return "interrupted inside"
    return "not interrupted"

print(answer("q"), flush=True)
"""


def test_a_signal_inside_the_applications_code_of_a_traced_call_is_not_held_back(
    tmp_path: Path,
) -> None:
    done = run(tmp_path, "user-code", USER_CODE_INTERRUPTED)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted inside"
