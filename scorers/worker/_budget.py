"""The judge budget gate: before claiming, the judge model's spend in the current period (every
worker's stored results, this worker's unwritten ones, and its calls that timed out after being
sent) is held against the budget; once reached, the LLM variants are held back until the
period ends."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.budget import JudgeBudget
from recalltrace.scorers.worker._decisions import JudgeHold

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
