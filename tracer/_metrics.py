"""The tracer's own counters, exported through the OpenTelemetry metrics API.

Counting on the request path is a dict update under a lock; the values reach OpenTelemetry
through observable instruments read at collection time, so an application without a
MeterProvider pays nothing more, and one configured later still sees the totals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from recalltrace.tracer import _threads

logger = logging.getLogger("recalltrace.tracer")

CAPTURED = "rag.traces.captured"
SAMPLED = "rag.traces.sampled"
DROPPED = "rag.traces.dropped"
STORED = "rag.traces.stored"
VALUES_NOT_READ = "rag.tracer.values.not_read"
QUEUE_SIZE = "rag.tracer.queue.size"
LOST_BY_ENDED_PROCESSES = "rag.traces.lost_by_ended_processes"
POOL_CALLS = "rag.tracer.pool.calls"
POOL_SECONDS = "rag.tracer.pool.duration"


@dataclass(frozen=True)
class Ledger:
    """Where every request the tracer saw ended, since the process started.

    ``seen`` counts requests whose outermost decorated call ended or that span capture found;
    each is ``stored`` (the sink confirmed the write), ``sampled_out``, ``dropped`` (by
    reason) or still ``pending`` (queued, or held by the writer): once the writer is idle,
    ``seen == stored + sampled_out + dropped_total + pending``. ``other_dropped`` counts what
    was not a request record (late references, spans span capture could not use), and
    ``values_not_read`` the application objects left out of stored records (by reason).
    ``lost_by_ended_processes`` counts records that other processes held when they ended
    without running their exit code (killed), found by this one in their ledger files: not
    this process's requests, so outside its balance.
    """

    seen: int = 0
    stored: int = 0
    sampled_out: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    pending: int = 0
    other_dropped: Mapping[str, int] = field(default_factory=dict)
    values_not_read: Mapping[str, int] = field(default_factory=dict)
    lost_by_ended_processes: int = 0
    pool: Mapping[str, float] = field(default_factory=dict)
    """What the pools (``@retrieval(pool=...)``) did: ``queued``, ``calls``, ``failed``,
    ``timed_out``, ``empty``, ``dropped_queue_full``, ``skipped_share`` and ``seconds`` (time
    spent in pool calls, off the request path). Not requests: outside the balance."""

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def unaccounted(self) -> int:
        """``seen`` minus every outcome: 0 when the ledger balances."""
        return self.seen - self.stored - self.sampled_out - self.dropped_total - self.pending

    def __sub__(self, other: Ledger) -> Ledger:
        def minus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
            keys = sorted(set(a) | set(b))
            return {k: a.get(k, 0) - b.get(k, 0) for k in keys if a.get(k, 0) - b.get(k, 0)}

        return Ledger(
            seen=self.seen - other.seen,
            stored=self.stored - other.stored,
            sampled_out=self.sampled_out - other.sampled_out,
            dropped=minus(self.dropped, other.dropped),
            pending=self.pending - other.pending,
            other_dropped=minus(self.other_dropped, other.other_dropped),
            values_not_read=minus(self.values_not_read, other.values_not_read),
            lost_by_ended_processes=self.lost_by_ended_processes - other.lost_by_ended_processes,
            pool=minus(self.pool, other.pool),  # type: ignore[arg-type]
        )

    def line(self) -> str:
        """The ledger in one line."""
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self.dropped.items()))
        text = (
            f"{self.seen} request(s) seen: {self.stored} stored, {self.sampled_out} sampled "
            f"out, {self.dropped_total} dropped{f' ({reasons})' if reasons else ''}, "
            f"{self.pending} pending"
        )
        if self.values_not_read:
            values = ", ".join(f"{r} {n}" for r, n in sorted(self.values_not_read.items()))
            text += f"; application values left out of stored records: {values}"
        if self.other_dropped:
            text += (
                f"; other records dropped (late references, unusable spans): {self.other_dropped}"
            )
        if self.lost_by_ended_processes:
            text += (
                f"; {self.lost_by_ended_processes} record(s) held by other processes that ended "
                "killed, found in their ledger files"
            )
        if self.pool:
            text += "; pools: " + ", ".join(
                f"{name} {value:g}" for name, value in sorted(self.pool.items())
            )
        return text


class TracerStats:
    """Cumulative counts since the process started (reset in a forked child)."""

    def __init__(self) -> None:
        self._lock = _threads.Lock()
        # Finished requests are counted per thread, without a lock: every request of every
        # thread passes here, and a lock shared by the application's threads made them queue
        # behind each other (a third of a saturated server's time). Each thread writes only
        # its own dicts; readers add them up. Per operating-system thread, not per greenlet
        # (a gevent server would add a pair of dicts per request).
        self._local = _threads.local()
        self._per_thread: list[tuple[dict[str, int], dict[str, int]]] = []
        self.dropped: dict[tuple[str, str], int] = {}
        self._last_drop_log = 0.0
        self.clock: Callable[[], float] = time.monotonic
        """The monotonic clock (seconds) the drop lines are spaced on; a test may drive one."""
        self._unreported: dict[str, int] = {}
        self.stored: dict[str, int] = {}
        self.not_read: dict[str, int] = {}
        self.lost_elsewhere = 0
        self.pool: dict[str, float] = {}
        self.queue_size: Callable[[], int] = lambda: 0
        self.label: Callable[[str], str] = str
        """What an app name becomes as a metric label (scrubbed, when scrubbing is on)."""

    def reset(self) -> None:
        """Forget all counts (used in a forked child, whose parent keeps its own)."""
        self._lock = _threads.Lock()
        self._local = _threads.local()
        self._per_thread = []
        self.dropped = {}
        self._unreported = {}
        self.stored = {}
        self.not_read = {}
        self.lost_elsewhere = 0
        self.pool = {}

    def pool_count(self, outcome: str, count: int = 1) -> None:
        """Count a pool outcome (see :attr:`Ledger.pool`)."""
        with self._lock:
            self.pool[outcome] = self.pool.get(outcome, 0) + count

    def pool_seconds(self, seconds: float) -> None:
        """Add the duration of one pool call."""
        with self._lock:
            self.pool["seconds"] = self.pool.get("seconds", 0.0) + seconds

    def records_stored(self, apps: Iterable[str]) -> None:
        """Count records the sink confirmed as written (one app name per record)."""
        with self._lock:
            for app in apps:
                self.stored[app] = self.stored.get(app, 0) + 1

    def lost_by_ended_process(self, count: int) -> None:
        """Count records another process held when it ended killed (found in its file)."""
        with self._lock:
            self.lost_elsewhere += count

    def values_not_read(self, reason: str, count: int) -> None:
        """Count application values left out of a stored record (``read_timeout``,
        ``readers_stuck``)."""
        with self._lock:
            self.not_read[reason] = self.not_read.get(reason, 0) + count

    def ledger(self) -> Ledger:
        """Every request seen and where it ended (see :class:`Ledger`)."""
        pending = self.queue_size()
        with self._lock:
            dropped: dict[str, int] = {}
            other: dict[str, int] = {}
            for (reason, app), n in self.dropped.items():
                # Drops without an app name are not request records: late references, and
                # spans span capture could not turn into a request.
                target = dropped if app else other
                target[reason] = target.get(reason, 0) + n
            seen_by_app, sampled_by_app = self._per_thread_totals()
            seen = sum(seen_by_app.values())
            sampled = sum(sampled_by_app.values())
            return Ledger(
                seen=seen,
                stored=sum(self.stored.values()),
                sampled_out=seen - sampled,
                dropped=dropped,
                pending=pending,
                other_dropped=other,
                values_not_read=dict(self.not_read),
                lost_by_ended_processes=self.lost_elsewhere,
                pool=dict(self.pool),
            )

    def trace_finished(self, app: str, sampled: bool) -> None:
        """Count one finished trace."""
        app = self.label(app)
        counts: tuple[dict[str, int], dict[str, int]] | None = getattr(self._local, "counts", None)
        if counts is None:
            counts = ({}, {})
            with self._lock:
                self._per_thread.append(counts)
            self._local.counts = counts
        captured, sampled_counts = counts
        captured[app] = captured.get(app, 0) + 1
        if sampled:
            sampled_counts[app] = sampled_counts.get(app, 0) + 1

    @property
    def captured(self) -> dict[str, int]:
        """Finished requests per app."""
        return self._per_thread_totals()[0]

    @property
    def sampled(self) -> dict[str, int]:
        """Finished sampled requests per app."""
        return self._per_thread_totals()[1]

    def _per_thread_totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """Both totals (copying the list of per-thread dicts is one step: no lock needed)."""
        totals: tuple[dict[str, int], dict[str, int]] = ({}, {})
        for counts in list(self._per_thread):
            for total, part in zip(totals, counts, strict=True):
                for app, n in list(part.items()):
                    total[app] = total.get(app, 0) + n
        return totals

    def drop(
        self,
        reason: str,
        app: str,
        count: int = 1,
        *,
        report: bool = True,
        said_by_caller: bool = False,
    ) -> None:
        """Count dropped records; say so at once, then at most every ten seconds, with the
        exact number of each reason since the last line (see :meth:`report_drops`).
        ``report=False`` leaves the line to the caller's :meth:`report_drops` (bulk drops);
        ``said_by_caller`` counts them without any drop line: the caller says them in a line
        of its own (the ledger's line at exit), which no other thread's drop line repeats."""
        if app:
            app = self.label(app)
        with self._lock:
            key = (reason, app)
            self.dropped[key] = self.dropped.get(key, 0) + count
            if not said_by_caller:
                self._unreported[reason] = self._unreported.get(reason, 0) + count
            due = report and not said_by_caller and self.clock() - self._last_drop_log >= 10.0
        if due:
            self.report_drops()

    def drop_withdrawn(self, reason: str, app: str) -> None:
        """Take back one drop of a record that was stored after all."""
        with self._lock:
            key = (reason, app)
            left = self.dropped.get(key, 0) - 1
            if left > 0:
                self.dropped[key] = left
            else:
                self.dropped.pop(key, None)

    def report_drops_when_due(self) -> None:
        """:meth:`report_drops` if ten seconds passed since the last line (writer cycles)."""
        if self._unreported and self.clock() - self._last_drop_log >= 10.0:
            self.report_drops()

    def report_drops(self) -> None:
        """Log the drops not yet reported, exactly, in one line (nothing when there are none)."""
        with self._lock:
            if not self._unreported:
                return
            pending, self._unreported = self._unreported, {}
            self._last_drop_log = self.clock()
        references = pending.pop("reference_not_found", 0)
        if references:
            # A late reference (set_reference) whose trace was never found: no record was lost.
            logger.warning(
                "recalltrace could not attach %d late reference(s): no stored trace has the id "
                "given to set_reference within reference_wait (counted as reference_not_found "
                "in the %s metric)",
                references,
                DROPPED,
            )
        if not pending:
            return
        total = sum(pending.values())
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(pending.items()))
        logger.warning(
            "recalltrace dropped %d trace record(s) (%s); see the %s metric",
            total,
            reasons,
            DROPPED,
        )

    def forget_unreported(self) -> None:
        """The drops not reported yet were said another way (the ledger's line at exit)."""
        with self._lock:
            self._unreported = {}
            self._last_drop_log = self.clock()

    def dropped_total(self, reason: str | None = None) -> int:
        """Dropped records so far, of one reason or all."""
        with self._lock:
            return sum(n for (r, _), n in self.dropped.items() if reason is None or r == reason)

    def snapshot(self) -> dict[str, Any]:
        """A copy of all counts (for tests and debugging)."""
        with self._lock:
            return {
                "captured": self.captured,
                "sampled": self.sampled,
                "dropped": dict(self.dropped),
                "stored": dict(self.stored),
                "values_not_read": dict(self.not_read),
            }


_registered: list[Any] = []
_registration_lock = _threads.Lock()


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

    def not_read(options: CallbackOptions) -> Iterable[Observation]:
        stats = stats_source()
        with stats._lock:
            items = list(stats.not_read.items())
        return [Observation(n, {"reason": reason}) for reason, n in items]

    def queue_size(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats_source().queue_size())]

    def lost(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats_source().lost_elsewhere)]

    def pool(seconds: bool) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            stats = stats_source()
            with stats._lock:
                items = list(stats.pool.items())
            if seconds:
                return [Observation(v) for k, v in items if k == "seconds"]
            return [Observation(v, {"outcome": k}) for k, v in items if k != "seconds"]

        return callback

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
    meter.create_observable_counter(
        STORED,
        callbacks=[per_app(lambda s: s.stored)],
        unit="{trace}",
        description="Sampled trace records the storage confirmed as written.",
    )
    meter.create_observable_counter(
        VALUES_NOT_READ,
        callbacks=[not_read],
        unit="{value}",
        description="Application objects left out of stored records, their reading not "
        "finished within the budget (read_timeout) or not started (readers_stuck).",
    )
    meter.create_observable_counter(
        LOST_BY_ENDED_PROCESSES,
        callbacks=[lost],
        unit="{trace}",
        description="Records other processes held when they ended without running their exit "
        "code (killed by SIGKILL, the OOM killer or a server's timeout), found by this process "
        "in their ledger files.",
    )
    meter.create_observable_counter(
        POOL_CALLS,
        callbacks=[pool(False)],
        unit="{call}",
        description="Pool calls (@retrieval(pool=...)) by outcome: queued, calls, failed, "
        "timed_out, empty, dropped_queue_full, skipped_share.",
    )
    meter.create_observable_counter(
        POOL_SECONDS,
        callbacks=[pool(True)],
        unit="s",
        description="Time spent in pool calls, on the pools' own threads.",
    )
    meter.create_observable_gauge(
        QUEUE_SIZE,
        callbacks=[queue_size],
        unit="{trace}",
        description="Records waiting in memory for the storage writer.",
    )
