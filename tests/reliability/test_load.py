"""The tracer under load with its queue bound reached on purpose (short variant for CI; the
60-second run at 2,000 requests per second is ``benchmarks/load_test.py``).

The app process calls a traced request at 2,000 per second while its database refuses
connections for part of the run: every call returns its own result, no call waits on storage,
memory stays flat, and every call is either stored or counted as dropped — exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from storage.db import create_engine_from_url
from tests.conftest import truncate_all
from tests.reliability.load import rss_growth_mib, run_load

pytestmark = pytest.mark.postgres


def check_load(summary: dict[str, Any], *, max_queue_size: int) -> None:
    assert summary["wrong"] == 0 and summary["errors"] == 0, summary
    assert summary["outages"] == 1
    assert summary["flushed"]
    dropped = summary["dropped"]
    # The bound was reached, and what the queue refused or storage never took is counted.
    assert dropped.get("queue_full", 0) > 0, summary
    assert summary["stored"] + sum(dropped.values()) == summary["calls"], summary
    assert summary["stored"] > max_queue_size
    # Nothing blocks: no call waited for the database (a blocked call would take as long
    # as a connection attempt or a write).
    assert summary["max_ms"] < 250, summary


def test_bound_reached_under_load_counts_every_drop(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    engine.dispose()
    summary = run_load(postgres_url, rate=2000, seconds=6, outage=(1.5, 4.0), max_queue_size=1000)
    check_load(summary, max_queue_size=1000)
    assert rss_growth_mib(summary, after_s=2.0) < 25, summary["rss_mib"]


@pytest.mark.slow
def test_sixty_seconds_at_two_thousand_requests_per_second(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    engine.dispose()
    summary = run_load(postgres_url, rate=2000, seconds=60, outage=(20.0, 35.0))
    check_load(summary, max_queue_size=2048)
    assert rss_growth_mib(summary, after_s=10.0) < 25, summary["rss_mib"]
