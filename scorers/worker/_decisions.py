"""The worker's decisions, apart from the database and the event loop: whether a failed job
gets another attempt and after how long, what a transient judge error leads to, when the LLM
variants are held back (the judge paused, the budget reached), what a claimed job is given back
as, and how many jobs to claim. Plain functions and small objects whose clock is passed in, so
each decision is tested on its own."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from recalltrace.scorers.worker._stats import LEFT_BUDGET

TRANSIENT_BACKOFF_STEPS = 6
"""A transient error's backoff grows with the job's attempts up to this many doublings."""

TransientAction = Literal["pause", "fail", "retry"]
"""What a transient judge error leads to: pause the judge's variants and give the job back,
fail the job, or try it again later without consuming an attempt."""


def attempt_left(attempts: int, max_attempts: int) -> bool:
    """Whether a job that failed on its attempt number ``attempts + 1`` (a ``failed`` result,
    or an error while scoring) is tried again rather than failed for good."""
    return attempts + 1 < max_attempts


def backoff(
    attempt: int,
    *,
    base_s: float,
    max_s: float,
    hint_s: float | None = None,
    rand: Callable[[], float] = random.random,
) -> timedelta:
    """The delay before attempt ``attempt + 1``: ``base_s`` doubled per attempt, capped at
    ``max_s``, jittered down to half of that at random; never shorter than ``hint_s`` (a
    ``Retry-After`` the judge sent)."""
    delay = min(max_s, base_s * 2 ** max(0, attempt))
    delay = delay / 2 + rand() * delay / 2
    if hint_s is not None:
        delay = max(delay, hint_s)
    return timedelta(seconds=delay)


def transient_action(
    *,
    unreachable: bool,
    first_transient_at: datetime | None,
    now: datetime,
    max_age_s: float,
) -> TransientAction:
    """What a transient judge error (one the judge client's own retries did not get past)
    leads to. A judge that nothing answered for is paused like a bad key (waiting job by job
    would hang silently); a job whose transient errors began more than ``max_age_s`` ago is
    failed; any other is retried without consuming an attempt."""
    if unreachable:
        return "pause"
    first = first_transient_at or now
    if (now - first).total_seconds() > max_age_s:
        return "fail"
    return "retry"


def transient_backoff_attempt(attempts: int) -> int:
    """The attempt number a transient error's backoff is computed for."""
    return min(attempts + 1, TRANSIENT_BACKOFF_STEPS)


class JudgeHold:
    """When the LLM variants are held back: paused after a judge error retrying cannot fix, or
    over budget until the period ends. Times are ``time.monotonic()`` seconds, passed in."""

    __slots__ = ("budget_until", "paused_until")

    def __init__(self) -> None:
        self.paused_until = 0.0
        self.budget_until = 0.0

    def pause(self, now: float, seconds: float) -> bool:
        """Pause (or extend the pause) for ``seconds`` from ``now``; True when this starts a
        pause, False when one was already running (said and counted once)."""
        already = self.paused(now)
        self.paused_until = now + seconds
        return not already

    def paused(self, now: float) -> bool:
        """Whether the judge is paused."""
        return self.paused_until > now

    def over_budget(self, now: float) -> bool:
        """Whether the budget of the current period is reached."""
        return self.budget_until > now

    def held(self, now: float) -> bool:
        """Whether LLM variants are neither claimed nor started."""
        return self.paused(now) or self.over_budget(now)

    def give_back(self, *, uses_llm: bool, now: float) -> tuple[bool, str | None]:
        """Whether a claimed job must be given back untouched instead of started, and the
        cause it is left unscored for, if this decides it (the budget; a pause names its own
        cause when it starts)."""
        if not uses_llm or not self.held(now):
            return False, None
        return True, LEFT_BUDGET if self.over_budget(now) else None


def given_back_cause(*, deadline_reached: bool) -> str:
    """Why running jobs cut off by a stop were given back."""
    return "given back at the deadline" if deadline_reached else "stopped"


@dataclass(frozen=True)
class ClaimSizing:
    """How many jobs to claim: keep up to half the concurrency claimed ahead, and claim when a
    quarter of that room (or a batch) is free, not after every finished job (each claim and
    trace load is a round trip; one per job would cap throughput)."""

    concurrency: int
    batch_size: int

    @property
    def prefetch(self) -> int:
        """Jobs held claimed beyond the running ones."""
        return max(1, min(self.batch_size, self.concurrency // 2))

    @property
    def refill_at(self) -> int:
        """Free room below which a busy worker does not claim yet."""
        return max(1, min(self.batch_size, self.concurrency // 4))

    def limit(self, *, running: int, ready: int) -> int:
        """How many jobs to claim now (0: not now)."""
        room = self.concurrency + self.prefetch - running - ready
        idle = running == 0 and ready == 0
        if room > 0 and (room >= self.refill_at or idle):
            return min(self.batch_size, room)
        return 0
