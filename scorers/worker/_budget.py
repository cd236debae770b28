"""The judge budget gate: before claiming, the judge model's spend in the current period (every
worker's stored results, this worker's unwritten ones, and its calls that timed out after being
sent) is held against the budget; once reached, the LLM variants are held back until the
period ends."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.budget import JudgeBudget
from recalltrace.scorers.worker._decisions import JudgeHold
from recalltrace.scorers.worker._presence import describe

logger = logging.getLogger("recalltrace.scorers.worker")

Verdict = Literal["under", "resumed", "reached", "still reached"]
"""What a spend held against the budget means: under it, under it again after a reached
period (say that the variants resume), reached now (say it, count it), or reached in a period
already said."""


@dataclass(frozen=True, slots=True)
class _Billed:
    when: datetime
    tokens: float
    usd: float


class BudgetGate:
    """One worker's view of a :class:`~recalltrace.scorers.budget.JudgeBudget` for one model."""

    def __init__(self, budget: JudgeBudget, model: str) -> None:
        self.budget = budget
        self.model = model
        self._said: datetime | None = None
        # Judge calls that timed out after being sent: the provider may bill them, and no
        # result of theirs is stored.
        self._possibly_billed: deque[_Billed] = deque()
        self.stale = False
        """A call timed out since the spend was read: read it again before the next call."""

    def note_possibly_billed(self, when: datetime, tokens: float, usd: float) -> None:
        """Count a judge call that timed out after being sent against the budget."""
        self._possibly_billed.append(_Billed(when, tokens, usd))
        self.stale = True

    def spent(
        self,
        stored_tokens: int,
        stored_usd: float,
        unwritten: Iterable[ScoreResult],
        start: datetime,
    ) -> float:
        """The spend in the budget's unit since ``start``: what storage counted, plus this
        worker's results not written yet and its possibly billed calls of the period."""
        tokens, usd = stored_tokens, stored_usd
        for result in unwritten:
            if result.model == self.model:
                tokens += (result.prompt_tokens or 0) + (result.completion_tokens or 0)
                usd += result.cost_usd or 0.0
        while self._possibly_billed and self._possibly_billed[0].when < start:
            self._possibly_billed.popleft()
        for billed in self._possibly_billed:
            tokens += int(billed.tokens)
            usd += billed.usd
        return self.budget.spent(tokens, usd)

    def assess(self, spent: float, *, now: datetime, now_m: float, hold: JudgeHold) -> Verdict:
        """Hold ``spent`` against the budget at ``now`` (``now_m`` on the monotonic clock),
        holding the LLM variants back in ``hold`` until the period ends once it is reached."""
        if spent < self.budget.amount:
            if hold.budget_until:
                hold.budget_until = 0.0
                return "resumed"
            return "under"
        end = self.budget.period_end(now)
        hold.budget_until = now_m + max((end - now).total_seconds(), 0.0)
        start = self.budget.period_start(now)
        if self._said == start:
            return "still reached"
        self._said = start
        return "reached"

    async def check(
        self,
        read_spend: Callable[[str, datetime], Awaitable[tuple[int, float]]],
        unwritten: Callable[[], Iterable[ScoreResult]],
        hold: JudgeHold,
    ) -> tuple[Verdict, float] | None:
        """Read the model's spend this period (``read_spend(model, period start)``, storage's
        count of every worker's results), add ``unwritten()`` results and this worker's
        possibly billed calls, and hold it against the budget in ``hold``, saying when the
        variants pause and resume. Returns the verdict and the spend; ``None`` when nothing
        was read (already held back until the period ends, or the read failed)."""
        now_m = time.monotonic()
        if hold.over_budget(now_m):
            return None
        budget = self.budget
        now = datetime.now(timezone.utc)
        start = budget.period_start(now)
        try:
            tokens, usd = await read_spend(self.model, start)
        except Exception as exc:
            logger.error("reading the judge's spend failed (%s); trying again", describe(exc))
            return None
        spent = self.spent(tokens, usd, unwritten(), start)
        verdict = self.assess(spent, now=now, now_m=now_m, hold=hold)
        if verdict == "resumed":
            logger.warning(
                "judge budget: a new %s began (%s spent of %s); LLM variants resume",
                budget.period,
                _amount(spent, budget.unit),
                budget.describe(),
            )
        elif verdict == "reached":
            logger.error(
                "JUDGE BUDGET REACHED: %s spent of %s by %s (every worker on this database); "
                "LLM variants are not claimed until %s UTC, jobs already claimed finish; "
                "non-LLM variants go on.",
                _amount(spent, budget.unit),
                budget.describe(),
                self.model,
                budget.period_end(now).strftime("%Y-%m-%d %H:%M"),
            )
        return verdict, spent


def _amount(value: float, unit: str) -> str:
    return f"{value:,.0f} tokens" if unit == "tokens" else f"{value:.4f} USD"
