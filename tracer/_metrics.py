"""The tracer's own counters, exported through the OpenTelemetry metrics API.

Counting on the request path is a dict update under a lock; the values reach OpenTelemetry
through observable instruments read at collection time, so an application without a
MeterProvider pays nothing more, and one configured later still sees the totals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger("recalltrace.tracer")

CAPTURED = "rag.traces.captured"
SAMPLED = "rag.traces.sampled"
DROPPED = "rag.traces.dropped"
QUEUE_SIZE = "rag.tracer.queue.size"


class TracerStats:
    """Cumulative counts since the process started (reset in a forked child)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.captured: dict[str, int] = {}
        self.sampled: dict[str, int] = {}
        self.dropped: dict[tuple[str, str], int] = {}
        self._last_drop_log = 0.0
        self._unreported: dict[str, int] = {}
        self.queue_size: Callable[[], int] = lambda: 0
        self.label: Callable[[str], str] = str
        """What an app name becomes as a metric label (scrubbed, when scrubbing is on)."""

    def reset(self) -> None:
        """Forget all counts (used in a forked child, whose parent keeps its own)."""
        self._lock = threading.Lock()
        self.captured = {}
        self.sampled = {}
        self.dropped = {}
        self._unreported = {}

    def trace_finished(self, app: str, sampled: bool) -> None:
        """Count one finished trace."""
        app = self.label(app)
        with self._lock:
            self.captured[app] = self.captured.get(app, 0) + 1
            if sampled:
                self.sampled[app] = self.sampled.get(app, 0) + 1

    def drop(self, reason: str, app: str, count: int = 1, *, report: bool = True) -> None:
        """Count dropped records; say so at once, then at most every ten seconds, with the
        exact number of each reason since the last line (see :meth:`report_drops`).
        ``report=False`` leaves the line to the caller's :meth:`report_drops` (bulk drops)."""
        if app:
            app = self.label(app)
        with self._lock:
            key = (reason, app)
            self.dropped[key] = self.dropped.get(key, 0) + count
            self._unreported[reason] = self._unreported.get(reason, 0) + count
            due = report and time.monotonic() - self._last_drop_log >= 10.0
        if due:
            self.report_drops()

    def report_drops_when_due(self) -> None:
        """:meth:`report_drops` if ten seconds passed since the last line (writer cycles)."""
        if self._unreported and time.monotonic() - self._last_drop_log >= 10.0:
            self.report_drops()

    def report_drops(self) -> None:
        """Log the drops not yet reported, exactly, in one line (nothing when there are none)."""
        with self._lock:
            if not self._unreported:
                return
            pending, self._unreported = self._unreported, {}
            self._last_drop_log = time.monotonic()
        total = sum(pending.values())
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(pending.items()))
        logger.warning(
            "recalltrace dropped %d trace record(s) (%s); see the %s metric",
            total,
            reasons,
            DROPPED,
        )

    def dropped_total(self, reason: str | None = None) -> int:
        """Dropped records so far, of one reason or all."""
        with self._lock:
            return sum(n for (r, _), n in self.dropped.items() if reason is None or r == reason)

    def snapshot(self) -> dict[str, Any]:
        """A copy of all counts (for tests and debugging)."""
        with self._lock:
            return {
                "captured": dict(self.captured),
                "sampled": dict(self.sampled),
                "dropped": dict(self.dropped),
            }


_registered: list[Any] = []
_registration_lock = threading.Lock()


def register_instruments(
    stats_source: Callable[[], TracerStats], meter_provider: Any = None
) -> None:
    """Create the observable instruments, once per MeterProvider, on ``meter_provider`` or the
    global one (a proxy until the application sets one, which then receives the values).
    ``stats_source`` returns the current stats object."""
    from opentelemetry import metrics
    from opentelemetry.metrics import CallbackOptions, Observation

    with _registration_lock:
        if any(provider is meter_provider for provider in _registered):
            return
        _registered.append(meter_provider)
    if meter_provider is None:
        meter = metrics.get_meter("recalltrace.tracer")
    else:
        meter = meter_provider.get_meter("recalltrace.tracer")

    def per_app(counts: Callable[[TracerStats], dict[str, int]]) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            stats = stats_source()
            with stats._lock:
                items = list(counts(stats).items())
            return [Observation(n, {"rag.app": app}) for app, n in items]

        return callback

    def dropped(options: CallbackOptions) -> Iterable[Observation]:
        stats = stats_source()
        with stats._lock:
            items = list(stats.dropped.items())
        return [
            Observation(n, {"reason": reason, **({"rag.app": app} if app else {})})
            for (reason, app), n in items
        ]

    def queue_size(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats_source().queue_size())]

    meter.create_observable_counter(
        CAPTURED,
        callbacks=[per_app(lambda s: s.captured)],
        unit="{trace}",
        description="Traces whose outermost decorated span ended.",
    )
    meter.create_observable_counter(
        SAMPLED,
        callbacks=[per_app(lambda s: s.sampled)],
        unit="{trace}",
        description="Traces sampled for storage and scoring.",
    )
    meter.create_observable_counter(
        DROPPED,
        callbacks=[dropped],
        unit="{trace}",
        description="Sampled trace records (or late references) that were never stored.",
    )
    meter.create_observable_gauge(
        QUEUE_SIZE,
        callbacks=[queue_size],
        unit="{trace}",
        description="Records waiting in memory for the storage writer.",
    )
