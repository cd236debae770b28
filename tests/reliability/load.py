"""The load scenario shared by ``test_load.py`` (short) and ``benchmarks/load_test.py`` (60 s).

An app process (``tests.reliability.app_process``) calls a traced request at a fixed rate while
its database refuses connections for a window of the run, so the tracer's queue reaches its
bound on purpose. Returns the app's own summary plus what was stored, so that the caller can
check that every call is accounted for: stored or counted as dropped, exactly.

The fault windows are counted in calls, not seconds: a window ``(begin, end)`` starts once the
app has made ``begin x rate`` calls and ends once it has made ``end x rate``. On a quiet host
that is the same as seconds; on a busy one the calls lag the clock and the windows follow them.
It also makes "no call waits on storage" exact: a request path that waited on the refusing or
hanging database would make no call during the fault, so the fault would never end; the
harness ends it after :data:`~tests.support.clocks.HANG_GUARD_S` without a call and reports
``stalled``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import Trace
from tests.reliability.helpers import (
    ConnectionKiller,
    last_json,
    spawn,
    with_application_name,
)
from tests.support.clocks import HANG_GUARD_S

APP_NAME = "rt_load_app"


def run_load(
    url: str,
    *,
    rate: float,
    seconds: float,
    outage: tuple[float, float] | None,
    hang: tuple[float, float] | None = None,
    max_queue_size: int = 2048,
    mode: str = "recalltrace",
    flush_timeout: float = 60.0,
) -> dict[str, Any]:
    """Run the app for ``seconds`` at ``rate``; refuse its database from ``outage[0]`` to
    ``outage[1]`` seconds' worth of calls into the run, and make its writes hang from
    ``hang[0]`` to ``hang[1]``. The summary gets ``stored`` (traces in the database) and
    ``stalled`` (faults during which the app made no call for :data:`HANG_GUARD_S`)."""
    app_url = with_application_name(url, APP_NAME)
    with tempfile.NamedTemporaryFile(prefix="rt-load-", suffix=".calls", delete=False) as progress:
        progress.write(bytes(8))
    proc = spawn(
        [
            "-m", "tests.reliability.app_process", "--database-url", app_url, "--mode", mode,
            "--rate", str(rate), "--seconds", str(seconds),
            "--max-queue-size", str(max_queue_size), "--flush-timeout", str(flush_timeout),
            "--progress-file", progress.name,
        ]
    )  # fmt: skip
    killer = ConnectionKiller(url, (APP_NAME,))
    fault_error: list[BaseException] = []
    stalled = [0]

    def calls_made() -> int:
        with open(progress.name, "rb") as handle:
            return int.from_bytes(handle.read(8), "little")

    def reached(calls: float) -> Callable[[], bool]:
        """True once the app has made ``calls`` calls; true as well (counted as a stall)
        when it has made none for HANG_GUARD_S, or when it has exited."""
        last = [calls_made(), time.monotonic()]

        def check() -> bool:
            made = calls_made()
            if made >= calls or proc.poll() is not None:
                return True
            if made != last[0]:
                last[0], last[1] = made, time.monotonic()
            elif time.monotonic() - last[1] > HANG_GUARD_S:
                stalled[0] += 1
                return True
            return False

        return check

    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "STARTED", line + (proc.stderr.read() if proc.stderr else "")

        def inject() -> None:
            faults = [(window, "outage") for window in [outage] if window is not None]
            faults += [(window, "hang") for window in [hang] if window is not None]
            try:
                for (begin, end), kind in sorted(faults):
                    start_at = reached(begin * rate)
                    while not start_at():
                        time.sleep(0.01)
                    if kind == "outage":
                        killer.outage(end - begin, until=reached(end * rate))
                    else:
                        killer.hang(url, end - begin, until=reached(end * rate))
            except BaseException as exc:
                fault_error.append(exc)

        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
        out, err = proc.communicate(timeout=seconds + flush_timeout + 120)
        injector.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        killer.close()
        os.unlink(progress.name)
    if fault_error:
        raise fault_error[0]
    assert proc.returncode == 0, err[-3000:]
    summary = last_json(out)
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        summary["stored"] = int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    engine.dispose()
    summary["killed_connections"] = killer.killed
    summary["outages"] = killer.outages
    summary["hangs"] = killer.hangs
    summary["stalled"] = stalled[0]
    return summary


def rss_growth_mib(
    summary: dict[str, Any], *, after_calls: int | None = None, after_s: float | None = None
) -> float:
    """RSS at the end of the run minus RSS at the first sample taken once ``after_calls`` calls
    were made (or ``after_s`` seconds in): start-up and the filling of bounded queues and
    buffers excluded. Counting calls rather than seconds keeps the check the same on a busy
    host, where the calls (and the memory that follows them) lag the clock."""
    samples = summary["rss_mib"]
    if after_calls is not None:
        later = [mib for _t, mib, calls in samples if calls >= after_calls]
    else:
        later = [mib for t, mib, _calls in samples if t >= (after_s or 0.0)]
    if len(later) < 2:
        return 0.0
    return float(later[-1] - later[0])
