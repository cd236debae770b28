"""The tracer's counts of finished requests: exact across threads, without a shared lock."""

from __future__ import annotations

import threading

from recalltrace.tracer._metrics import TracerStats


def test_requests_finished_on_many_threads_are_counted_exactly() -> None:
    stats = TracerStats()
    start = threading.Barrier(8)

    def finish_many(index: int) -> None:
        start.wait()
        for n in range(5000):
            stats.trace_finished(f"app-{index % 2}", sampled=n % 10 == 0)

    threads = [threading.Thread(target=finish_many, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.captured == {"app-0": 20_000, "app-1": 20_000}
    assert stats.sampled == {"app-0": 2_000, "app-1": 2_000}
    ledger = stats.ledger()
    assert ledger.seen == 40_000 and ledger.sampled_out == 36_000
    assert stats.snapshot()["captured"] == {"app-0": 20_000, "app-1": 20_000}


def test_counts_are_readable_while_the_lock_is_held() -> None:
    """The metric callbacks read the counts holding the stats' lock (no deadlock)."""
    stats = TracerStats()
    stats.trace_finished("app", sampled=True)
    with stats._lock:
        assert stats.captured == {"app": 1} and stats.sampled == {"app": 1}
