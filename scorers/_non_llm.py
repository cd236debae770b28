"""The two variants that need no judge: string similarity and id overlap."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Literal

from rapidfuzz import process
from rapidfuzz.distance import Hamming, Jaro, JaroWinkler, LCSseq, Levenshtein

from scorers._base import BaseScorer, elapsed_ms, is_blank, validate_inputs
from scorers._result import ScoreResult

Measure = Literal["levenshtein", "hamming", "jaro", "jaro_winkler"]

_numpy: Any
try:  # RapidFuzz's all-pairs matrix needs NumPy; without it a loop gives the same numbers.
    import numpy as _numpy
except ImportError:  # pragma: no cover - depends on the environment
    _numpy = None


def _candidates(
    references: list[str], retrieved: list[str], threshold: float
) -> list[list[tuple[float, int, int]]]:
    """Per reference, the retrieved contexts whose similarity bound exceeds ``threshold``, as
    ``(bound, index, common)`` pairs (``common``: the LCS length), highest bound first.

    No reference may equal a retrieved context (the caller matches those first): then a pair
    with no common character has a bound of 0 and is never a candidate.
    """
    ref_lengths = [len(r) for r in references]
    lengths = [len(c) for c in retrieved]
    if _numpy is not None:
        # Every pair needs an LCS above threshold x its longer length, so above threshold x the
        # smallest such length over all pairs. As RapidFuzz's cutoff, it limits the LCS to a
        # diagonal band and reports 0 for the pairs below it, which are then skipped whole.
        cutoff = int(threshold * max(min(ref_lengths), min(lengths)))
        matrix = process.cdist(
            references,
            retrieved,
            scorer=LCSseq.similarity,
            dtype=_numpy.int32,
            workers=1,
            score_cutoff=cutoff,
        ).ravel()
        kept = _numpy.flatnonzero(matrix)
        width = len(retrieved)
        pairs = [
            (k // width, k % width, common)
            for k, common in zip(kept.tolist(), matrix[kept].tolist(), strict=True)
        ]
    else:
        similarity = LCSseq.similarity
        pairs = [
            (i, j, similarity(reference, context))
            for i, reference in enumerate(references)
            for j, context in enumerate(retrieved)
        ]
    out: list[list[tuple[float, int, int]]] = [[] for _ in references]
    for i, j, common in pairs:
        length, other = ref_lengths[i], lengths[j]
        longest = length if length > other else other
        # The bound is computed exactly as the similarity would be: 1 - (longest - LCS) / longest.
        bound = 1.0 - (longest - common) / longest if longest else 1.0
        if bound > threshold:
            out[i].append((bound, j, common))
    for row in out:
        if len(row) > 1:
            row.sort(key=lambda pair: (-pair[0], pair[1]))
    return out


def _levenshtein_similarity(reference: str, context: str, common: int) -> float:
    """``1 - Levenshtein.normalized_distance``, bit for bit, from the pair's LCS length.

    The distance is at most the Indel distance (len + len - 2 LCS) and, for equal lengths, the
    Hamming distance, and at least max(len) - LCS. When the two meet, that is the distance;
    otherwise, given the ceiling as its cutoff, RapidFuzz computes only a diagonal band of the
    matrix, which for close pairs is a fraction of it.
    """
    length, other = len(reference), len(context)
    longest = length if length > other else other
    if not longest:
        return 1.0
    distance = length + other - 2 * common  # the ceiling, until computed
    if length == other:
        distance = min(distance, Hamming.distance(reference, context))
    if distance > longest - common:  # else the floor max(len) - LCS meets it: that is the distance
        distance = Levenshtein.distance(reference, context, score_cutoff=distance)
    return 1.0 - distance / longest


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
        result = self._compute(validate_inputs(self.needs, inputs), started)
        if result.latency_ms is None:
            result = replace(result, latency_ms=elapsed_ms(started))
        return result

    async def _ascore(self, clean: dict[str, Any], started: float) -> ScoreResult:
        return self._compute(clean, started)

    def _best_matches(
        self, references: list[str], retrieved: list[str]
    ) -> list[tuple[int | None, float | None]]:
        """For each reference: index and similarity of its best retrieved match when that
        passes the threshold, else ``(None, None)``.

        Similarities are computed exactly as ``1 - normalized_distance``, so scores agree bit
        for bit with a plain loop over every pair.
        """
        threshold = self.threshold
        distance = self._distance
        if self.measure != "levenshtein":
            out: list[tuple[int | None, float | None]] = []
            for reference in references:
                match = process.extractOne(reference, retrieved, scorer=distance)
                similarity = 1.0 - match[1]
                out.append((match[2], similarity) if similarity > threshold else (None, None))
            return out
        # Levenshtein: distance >= max(len) - LCS, so 1 - (max(len) - LCS) / max(len) bounds
        # the similarity from above. The LCS is several times cheaper than the distance and the
        # bound rules out most unrelated pairs; the exact distance runs only for the rest.
        # A reference context retrieved verbatim (a golden chunk, typically) has similarity 1 with
        # its first copy, which no other context can beat: no matrix needed for it.
        first_copy: dict[str, int] = {}
        for index, context in enumerate(retrieved):
            first_copy.setdefault(context, index)
        verbatim = threshold < 1.0
        best_of: list[tuple[int | None, float | None]] = [
            (first_copy[reference], 1.0) if verbatim and reference in first_copy else (None, None)
            for reference in references
        ]
        rest = [i for i, found in enumerate(best_of) if found[0] is None]
        if not rest:
            return best_of
        pending = [references[i] for i in rest]
        for position, reference, candidates in zip(
            rest, pending, _candidates(pending, retrieved, threshold), strict=True
        ):
            best_index: int | None = None
            best = -1.0
            for upper, index, common in candidates:
                if upper <= best:
                    break  # sorted by bound: no later candidate can beat the best
                similarity = _levenshtein_similarity(reference, retrieved[index], common)
                if similarity > best:
                    best_index, best = index, similarity
            if best > threshold:
                best_of[position] = (best_index, best)
        return best_of

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
        best = self._best_matches(references, retrieved)
        for ref_index, (match_index, similarity) in enumerate(best):
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
        result = self._compute(validate_inputs(self.needs, inputs), started)
        if result.latency_ms is None:
            result = replace(result, latency_ms=elapsed_ms(started))
        return result

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
