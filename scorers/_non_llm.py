"""The two variants that need no judge: string similarity and id overlap."""

from __future__ import annotations

import time
from typing import Any, Literal

from rapidfuzz import process
from rapidfuzz.distance import Hamming, Jaro, JaroWinkler, LCSseq, Levenshtein

from scorers._base import BaseScorer, elapsed_ms, is_blank, validate_inputs
from scorers._result import ScoreResult

Measure = Literal["levenshtein", "hamming", "jaro", "jaro_winkler"]

_MEASURES: dict[str, Any] = {
    "levenshtein": Levenshtein,
    "hamming": Hamming,
    "jaro": Jaro,
    "jaro_winkler": JaroWinkler,
}


class NonLLMContextRecall(BaseScorer):
    """Share of reference contexts that some retrieved context matches closely.

    similarity = 1 - normalised distance (RapidFuzz); a reference context is found when its best
    similarity over the retrieved contexts is strictly greater than ``threshold``.
    """

    key = "non_llm_context_recall"

    def __init__(self, *, measure: Measure = "levenshtein", threshold: float = 0.5) -> None:
        """Create the scorer.

        Args:
            measure: ``"levenshtein"`` (default), ``"hamming"``, ``"jaro"`` or ``"jaro_winkler"``.
            threshold: a reference context is found when its best similarity is strictly
                greater than this value, in [0, 1].
        """
        super().__init__()
        if measure not in _MEASURES:
            raise ValueError(f"unknown measure {measure!r}; choose one of {sorted(_MEASURES)}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError("threshold must be a number")
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], not {threshold!r}")
        self.measure: Measure = measure
        self.threshold: float = float(threshold)
        self._distance = _MEASURES[measure].normalized_distance

    def score(self, **inputs: Any) -> ScoreResult:
        """Score one trace; pure CPU work, so no event loop is involved."""
        started = time.perf_counter()
        return self._compute(validate_inputs(self.needs, inputs), started)

    async def _ascore(self, clean: dict[str, Any], started: float) -> ScoreResult:
        return self._compute(clean, started)

    def _best_match(self, reference: str, retrieved: list[str]) -> tuple[int | None, float | None]:
        """Index and similarity of the best retrieved match when it passes the threshold.

        Returns ``(None, None)`` when no retrieved context passes. The similarity is computed
        exactly as ``1 - normalized_distance`` so scores agree bit for bit with a plain loop.
        """
        threshold = self.threshold
        if self.measure != "levenshtein":
            match = process.extractOne(reference, retrieved, scorer=self._distance)
            if match is None:
                return None, None
            similarity = 1.0 - match[1]
            return (match[2], similarity) if similarity > threshold else (None, None)
        # Levenshtein: max(len) - LCS <= distance <= Indel distance. The LCS bound is several
        # times cheaper than the distance itself and rules out most unrelated pairs, so the
        # exact distance runs only for candidates that might pass.
        best_index: int | None = None
        best_similarity = -1.0
        length = len(reference)
        for index, candidate in enumerate(retrieved):
            longest = max(length, len(candidate))
            if longest == 0:
                similarity = 1.0
            else:
                upper = 1.0 - (longest - LCSseq.similarity(reference, candidate)) / longest
                if upper <= threshold or upper <= best_similarity:
                    continue
                similarity = 1.0 - self._distance(reference, candidate)
            if similarity > best_similarity:
                best_index, best_similarity = index, similarity
        if best_index is None or not best_similarity > threshold:
            return None, None
        return best_index, best_similarity

    def _compute(self, clean: dict[str, Any], started: float) -> ScoreResult:
        missing = self.missing_input(clean)
        if missing is not None or is_blank(clean["reference_contexts"]):
            return missing or self.skipped("The trace has no reference contexts to recall.")
        references: list[str] = clean["reference_contexts"]
        retrieved: list[str] = clean["retrieved_contexts"] or []
        if not retrieved:
            return self.scored(
                0.0,
                f"Nothing was retrieved, so none of the {len(references)} reference contexts "
                "were found.",
                details={"measure": self.measure, "threshold": self.threshold, "matches": []},
                latency_ms=elapsed_ms(started),
            )
        matches = []
        found = 0
        for ref_index, reference in enumerate(references):
            match_index, similarity = self._best_match(reference, retrieved)
            if match_index is not None:
                found += 1
            matches.append(
                {
                    "reference_index": ref_index,
                    "found": match_index is not None,
                    "retrieved_index": match_index,
                    "similarity": similarity,
                }
            )
        total = len(references)
        return self.scored(
            found / total,
            f"{found} of {total} reference contexts matched a retrieved context with "
            f"{self.measure} similarity above {self.threshold:g}.",
            details={"measure": self.measure, "threshold": self.threshold, "matches": matches},
            latency_ms=elapsed_ms(started),
        )


class IDBasedContextRecall(BaseScorer):
    """Share of distinct reference context ids found among the retrieved ids."""

    key = "id_based_context_recall"

    def score(self, **inputs: Any) -> ScoreResult:
        """Score one trace; pure CPU work, so no event loop is involved."""
        started = time.perf_counter()
        return self._compute(validate_inputs(self.needs, inputs), started)

    async def _ascore(self, clean: dict[str, Any], started: float) -> ScoreResult:
        return self._compute(clean, started)

    def _compute(self, clean: dict[str, Any], started: float) -> ScoreResult:
        missing = self.missing_input(clean)
        if missing is not None or is_blank(clean["reference_context_ids"]):
            return missing or self.skipped("The trace has no reference context ids to recall.")
        # dict.fromkeys keeps first-seen order, so details list missing ids as given.
        reference_ids = list(dict.fromkeys(clean["reference_context_ids"]))
        retrieved_ids = set(clean["retrieved_context_ids"] or ())
        missing_ids = [i for i in reference_ids if i not in retrieved_ids]
        found = len(reference_ids) - len(missing_ids)
        total = len(reference_ids)
        if not retrieved_ids:
            reason = f"Nothing was retrieved, so none of the {total} reference ids were found."
        else:
            reason = f"{found} of {total} distinct reference ids were retrieved."
        return self.scored(
            found / total,
            reason,
            details={
                "found_ids": [i for i in reference_ids if i in retrieved_ids],
                "missing_ids": missing_ids,
            },
            latency_ms=elapsed_ms(started),
        )
