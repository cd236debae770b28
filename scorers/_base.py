"""The scorer interface, input validation and the helpers every variant shares."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Protocol, runtime_checkable

from recalltrace.scorers._errors import ScorerInputError
from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.catalog import metric_info

#: Every input name a scorer accepts, as the specification spells them.
INPUT_NAMES: tuple[str, ...] = (
    "user_input",
    "response",
    "retrieved_contexts",
    "reference",
    "reference_contexts",
    "retrieved_context_ids",
    "reference_context_ids",
    "pool_contexts",
    "pool_context_ids",
)
_KNOWN_INPUTS = frozenset(INPUT_NAMES)
_TEXT_INPUTS = frozenset({"user_input", "response", "reference"})
_TEXT_LIST_INPUTS = frozenset({"retrieved_contexts", "reference_contexts", "pool_contexts"})
_ID_LIST_INPUTS = frozenset({"retrieved_context_ids", "reference_context_ids", "pool_context_ids"})
#: ``isinstance(item, str)`` as a one-argument function, for a check that loops in C.
_is_str = str.__instancecheck__


@runtime_checkable
class Scorer(Protocol):
    """What every context-recall variant offers.

    ``score`` and ``ascore`` take the specification's keyword inputs (``user_input``,
    ``response``, ``retrieved_contexts``, ``reference``, ``reference_contexts``,
    ``retrieved_context_ids``, ``reference_context_ids``, and ``pool_contexts`` with
    ``pool_context_ids`` for a pool); inputs a variant does not need are
    ignored. A missing or empty needed input gives a ``skipped`` result, never an exception.
    """

    name: str
    version: str
    needs: tuple[str, ...]
    uses_llm: bool

    def score(self, **inputs: Any) -> ScoreResult:
        """Score one trace synchronously (not from inside a running event loop)."""
        ...

    async def ascore(self, **inputs: Any) -> ScoreResult:
        """Score one trace."""
        ...


def _check_list(name: str, value: Any, allow_int: bool) -> list[str]:
    if type(value) is list and all(map(_is_str, value)):
        return value  # the common case, checked in one pass
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ScorerInputError(f"{name} must be a list of strings, not {type(value).__name__}")
    items: list[str] = []
    for index, item in enumerate(value):
        if item is None:
            raise ScorerInputError(f"{name}[{index}] is None; remove it or pass a string")
        if isinstance(item, str):
            items.append(item)
        elif allow_int and isinstance(item, int) and not isinstance(item, bool):
            items.append(str(item))
        else:
            kind = "a string or an integer id" if allow_int else "a string"
            raise ScorerInputError(f"{name}[{index}] must be {kind}, not {type(item).__name__}")
    return items


def validate_inputs(needs: Sequence[str], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Check the needed inputs' types and return them normalised.

    Text inputs come back as ``str``, context lists as ``list[str]`` and id lists as
    ``list[str]`` (integer ids become strings, so ``1`` matches ``"1"``). Inputs that are absent
    or ``None`` come back as ``None``. Unknown input names raise, to catch typos early.
    """
    if not _KNOWN_INPUTS.issuperset(inputs):
        unknown = sorted(set(inputs) - _KNOWN_INPUTS)
        raise ScorerInputError(
            f"unknown input(s) {', '.join(unknown)}; known inputs: {', '.join(INPUT_NAMES)}"
        )
    clean: dict[str, Any] = {}
    for name in needs:
        value = inputs.get(name)
        if value is None:
            clean[name] = None
        elif name in _TEXT_INPUTS:
            if not isinstance(value, str):
                raise ScorerInputError(f"{name} must be a string, not {type(value).__name__}")
            clean[name] = value
        elif name in _TEXT_LIST_INPUTS:
            clean[name] = _check_list(name, value, allow_int=False)
        elif name in _ID_LIST_INPUTS:
            clean[name] = _check_list(name, value, allow_int=True)
        else:  # pragma: no cover - INPUT_NAMES and the sets above agree
            raise ScorerInputError(f"no validation rule for input {name!r}")
    return clean


def is_blank(value: Any) -> bool:
    """True for ``None``, an empty or whitespace-only string, or an empty list."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    return len(value) == 0


class BaseScorer(ABC):
    """Shared machinery: catalog identity, validation and the sync/async entry points."""

    key: ClassVar[str]

    def __init__(self) -> None:
        info = metric_info(self.key)
        self.name: str = info.key
        self.version: str = info.version
        self.needs: tuple[str, ...] = info.needs
        self.uses_llm: bool = info.uses_llm

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, version={self.version!r})"

    def _result(self, status: str, value: float | None, reason: str, **fields: Any) -> ScoreResult:
        return ScoreResult(
            metric=self.name,
            value=value,
            status=status,  # type: ignore[arg-type]
            reason=reason,
            version=self.version,
            **fields,
        )

    def skipped(self, reason: str, **fields: Any) -> ScoreResult:
        """A ``skipped`` result of this variant."""
        return self._result("skipped", None, reason, **fields)

    def failed(self, reason: str, **fields: Any) -> ScoreResult:
        """A ``failed`` result of this variant."""
        return self._result("failed", None, reason, **fields)

    def scored(self, value: float, reason: str, **fields: Any) -> ScoreResult:
        """A ``scored`` result of this variant."""
        return self._result("scored", value, reason, **fields)

    def missing_input(self, clean: Mapping[str, Any]) -> ScoreResult | None:
        """A ``skipped`` result naming the first needed input that is absent or ``None``, or a
        text input (question, response, reference) that is empty or whitespace only.

        Empty lists are left to each variant: the specification scores some of them 0.0.
        """
        for name in self.needs:
            value = clean.get(name)
            if value is None:
                return self.skipped(f"The trace has no {name}, which this metric needs.")
            if isinstance(value, str) and not value.strip():
                return self.skipped(f"The trace's {name} is empty, and this metric needs it.")
        return None

    def score(self, **inputs: Any) -> ScoreResult:
        """Score one trace synchronously.

        Runs ``ascore`` on a private event loop; inside a running loop call ``await ascore``
        instead (no loop is patched or nested).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ascore(**inputs))
        raise RuntimeError(
            f"{self.name}.score() was called inside a running event loop; use 'await ascore()'"
        )

    async def ascore(self, **inputs: Any) -> ScoreResult:
        """Score one trace; see :class:`Scorer`."""
        started = time.perf_counter()
        clean = validate_inputs(self.needs, inputs)
        result = await self._ascore(clean, started)
        if result.latency_ms is None:
            result = replace(result, latency_ms=elapsed_ms(started))
        return result

    @abstractmethod
    async def _ascore(self, clean: dict[str, Any], started: float) -> ScoreResult:
        """Score validated inputs (every needed name present as a key, possibly ``None``)."""


def elapsed_ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()`` reading)."""
    return round((time.perf_counter() - started) * 1000.0, 3)
