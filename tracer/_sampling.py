"""Head sampling: one decision per trace, computed from the trace id alone.

The decision compares the trace id's low 56 bits (the part W3C Trace Context level 2 requires to
be random) with a threshold proportional to the rate. Every process that sees the same trace id
and rate decides the same way, and raising the rate only adds traces: the set sampled at 10%
contains the set sampled at 5%.
"""

from __future__ import annotations

from collections.abc import Mapping

RANDOM_BITS = 56
_RANDOM_MASK = (1 << RANDOM_BITS) - 1
_FULL = 1 << RANDOM_BITS


def rate_threshold(rate: float) -> int:
    """The threshold for ``rate``: ids whose random part is below it are sampled."""
    if rate <= 0.0:
        return 0
    if rate >= 1.0:
        return _FULL
    return int(rate * _FULL)


def is_sampled(trace_id: int, threshold: int) -> bool:
    """Whether the trace ``trace_id`` (the 128-bit id as an int) falls under ``threshold``."""
    return (trace_id & _RANDOM_MASK) < threshold


class TraceSampler:
    """Thresholds for the default rate and the per-app rates, computed once."""

    __slots__ = ("_default", "_max", "_per_app")

    def __init__(self, rate: float, per_app: Mapping[str, float] | None = None) -> None:
        self._default = rate_threshold(rate)
        self._per_app = {app: rate_threshold(r) for app, r in (per_app or {}).items()}
        self._max = max([self._default, *self._per_app.values()])

    def should_sample(self, trace_id: int, app_name: str) -> bool:
        """The decision for a trace whose root is named ``app_name``."""
        threshold = self._per_app.get(app_name, self._default) if self._per_app else self._default
        return (trace_id & _RANDOM_MASK) < threshold

    def could_be_sampled(self, trace_id: int) -> bool:
        """False when no app's rate samples this trace id (so it cannot have been stored by a
        process configured like this one)."""
        return (trace_id & _RANDOM_MASK) < self._max

    @property
    def never(self) -> bool:
        """True when every rate is zero."""
        return self._max == 0
