"""A cap on what the judge may spend per period, shared by every worker through the database.

``JudgeBudget.parse("50/day")`` is 50 US dollars a day (LiteLLM's prices); ``"2000000tokens/day"``
(or ``2m tokens/day``) counts prompt and completion tokens instead; periods are ``minute``,
``hour`` and ``day``, aligned to UTC. Spend is what the stored results of the judge model
carry (every worker's), so the cap holds across workers and hosts; a worker reads it before
claiming LLM jobs, and the jobs already claimed finish, so spend stops within one claimed
batch per worker of the cap.

A judge answer a job reads back from the database (stored before its worker died, see
``docs/worker.md``) is not paid again: its result carries the stored call's tokens and cost
once (the crashed run that paid for it stored no result), so the spend read from the stored
results counts every paid call once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

Period = Literal["minute", "hour", "day"]
_STEPS: dict[str, timedelta] = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
}
_PATTERN = re.compile(
    r"^\s*(?P<dollar>\$)?\s*(?P<amount>\d+(?:\.\d+)?)\s*(?P<scale>[km])?\s*"
    r"(?P<unit>tokens?|usd|\$)?\s*/\s*(?P<period>minute|hour|day)\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class JudgeBudget:
    """At most ``amount`` (US dollars, or tokens) per ``period``."""

    amount: float
    unit: Literal["usd", "tokens"]
    period: Period

    @classmethod
    def parse(cls, text: str) -> JudgeBudget:
        """``50/day``, ``$2.5/hour``, ``200k tokens/day``; ``ValueError`` otherwise."""
        match = _PATTERN.match(text)
        if match is None:
            raise ValueError(
                f"expected a budget like 50/day (US dollars), 2.5/hour or 200k tokens/day, "
                f"got {text!r}"
            )
        amount = float(match["amount"])
        scale = (match["scale"] or "").lower()
        amount *= {"": 1, "k": 1e3, "m": 1e6}[scale]
        unit_text = (match["unit"] or "").lower()
        unit: Literal["usd", "tokens"] = "tokens" if unit_text.startswith("token") else "usd"
        if amount <= 0:
            raise ValueError(f"a budget must be more than 0, got {text!r}")
        period = match["period"].lower()
        assert period in _STEPS
        return cls(amount, unit, period)  # type: ignore[arg-type]

    def period_start(self, now: datetime) -> datetime:
        """The start (UTC) of the period ``now`` falls in."""
        now = now.astimezone(timezone.utc)
        if self.period == "minute":
            return now.replace(second=0, microsecond=0)
        if self.period == "hour":
            return now.replace(minute=0, second=0, microsecond=0)
        return now.replace(hour=0, minute=0, second=0, microsecond=0)

    def period_end(self, now: datetime) -> datetime:
        """When the period ``now`` falls in ends."""
        return self.period_start(now) + _STEPS[self.period]

    def spent(self, tokens: int, usd: float) -> float:
        """Of ``tokens`` and ``usd`` spent, what counts against this budget."""
        return float(tokens) if self.unit == "tokens" else usd

    def describe(self) -> str:
        """The budget in words (``50 USD per day``)."""
        amount = f"{self.amount:,.0f}" if self.unit == "tokens" else f"{self.amount:g}"
        return f"{amount} {'tokens' if self.unit == 'tokens' else 'USD'} per {self.period}"
