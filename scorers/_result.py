"""The result every scorer returns, whatever the variant."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["scored", "skipped", "failed"]
STATUSES: tuple[str, ...] = ("scored", "skipped", "failed")


@dataclass(frozen=True)
class ScoreResult:
    """One variant's verdict on one trace.

    ``value`` is a float in [0, 1] when ``status`` is ``"scored"`` and ``None`` otherwise; a NaN
    is never stored here. ``reason`` is always one human sentence, also for skipped and failed
    results, so a reader can tell "nothing to score" from "the judge broke".
    """

    metric: str
    """The variant's catalog key."""
    value: float | None
    """The score in [0, 1], or ``None`` unless ``status`` is ``"scored"``."""
    status: Status
    """``"scored"``, ``"skipped"`` (an input is missing) or ``"failed"`` (no valid judge answer)."""
    reason: str
    """One sentence saying why the value is what it is."""
    details: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable evidence: per-claim verdicts, best matches, missing ids, entity sets."""
    model: str | None = None
    """The judge model, for LLM variants."""
    prompt_tokens: int | None = None
    """Prompt tokens over every judge call made for this result."""
    completion_tokens: int | None = None
    """Completion tokens over every judge call made for this result."""
    cost_usd: float | None = None
    """Cost of every judge call, from LiteLLM's price list; ``None`` when the price is unknown."""
    latency_ms: float | None = None
    """Wall time spent producing this result, judge calls included."""
    version: str = "1"
    """The variant's version; a stored score is keyed by (trace, metric, version)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")
        if self.status == "scored":
            if self.value is None or not isinstance(self.value, (int, float)):
                raise ValueError("a scored result needs a numeric value")
            if math.isnan(self.value) or not 0.0 <= self.value <= 1.0:
                raise ValueError(f"a score must lie in [0, 1], not {self.value!r}")
            # Store a plain float even when a formula produced an int or a bool.
            object.__setattr__(self, "value", float(self.value))
        elif self.value is not None:
            raise ValueError(f"a {self.status} result carries no value")
        if not self.reason or not self.reason.strip():
            raise ValueError("a result always carries a reason")

    @property
    def label(self) -> str:
        """A word for the result, for viewers that show labels beside scores: ``complete``
        (1), ``partial`` (between 0 and 1), ``none`` (0), else the status (``skipped``,
        ``failed``)."""
        if self.status != "scored" or self.value is None:
            return self.status
        if self.value >= 1.0:
            return "complete"
        return "none" if self.value <= 0.0 else "partial"

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a plain, JSON-serialisable dictionary."""
        return asdict(self)
