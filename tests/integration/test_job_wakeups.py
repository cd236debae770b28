"""``JobStore.wait_for_jobs``: idle workers are woken when new jobs are written (Postgres
LISTEN/NOTIFY), and a backend that announces nothing leaves them to poll (SQLite)."""

from __future__ import annotations

import asyncio

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.repository import Repository
from tests.support.factories import make_repository, make_trace


def test_sqlite_announces_nothing_and_the_waiter_returns_at_once(sqlite_url: str) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url))
    woken: list[None] = []

    async def wait() -> None:
        await asyncio.wait_for(repo.wait_for_jobs(lambda: woken.append(None)), timeout=60)

    try:
        asyncio.run(wait())
    finally:
        repo.dispose()
    assert woken == []


def test_postgres_wakes_the_waiter_when_a_trace_brings_new_jobs(pg_repo: Repository) -> None:
    async def scenario() -> int:
        wakes = 0
        woken = asyncio.Event()

        def wake() -> None:
            nonlocal wakes
            wakes += 1
            woken.set()

        task = asyncio.create_task(pg_repo.wait_for_jobs(wake))
        try:
            # The first wake says the listener is connected (jobs may have come before it).
            await asyncio.wait_for(woken.wait(), timeout=60)
            assert wakes == 1
            woken.clear()
            await asyncio.to_thread(pg_repo.write_traces, [make_trace()])
            await asyncio.wait_for(woken.wait(), timeout=60)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        return wakes

    assert asyncio.run(scenario()) >= 2
