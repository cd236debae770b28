"""Background work a worker does for the queries: a ``warm`` function handed in by whoever
built the worker (``recalltrace worker`` hands in the history summaries' warming), called every
``summaries_interval_s`` in a database thread. Workers on one database share the work: what one
stored, the others find stored."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from recalltrace.scorers.worker._presence import describe

logger = logging.getLogger("recalltrace.scorers.worker")


class Warming:
    """When ``warm`` is due, and whether its failure has been said."""

    def __init__(self, warm: Callable[[], object] | None, interval_s: float | None) -> None:
        self._warm = warm
        self._interval_s = interval_s
        self._next = 0.0
        self._failing = False

    async def when_due(self, db_call: Callable[..., Awaitable[Any]]) -> None:
        """Call ``warm`` through ``db_call`` if it is due; a failure is said once, and so is
        the recovery."""
        warm, interval = self._warm, self._interval_s
        if interval is None or warm is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + interval
        try:
            await db_call(warm)
        except Exception as exc:
            if not self._failing:
                logger.warning(
                    "storing history summaries failed (%s); queries compute them until it "
                    "works again (said once)",
                    describe(exc),
                )
            self._failing = True
            return
        if self._failing:
            logger.info("storing history summaries works again")
        self._failing = False
