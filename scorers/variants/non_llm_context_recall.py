"""``non_llm_context_recall``: the share of reference contexts closely matched, by string
similarity, by some retrieved context. No judge."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Literal

from rapidfuzz import process
from rapidfuzz.distance import Hamming, Jaro, JaroWinkler, LCSseq, Levenshtein

from recalltrace.scorers._base import BaseScorer, elapsed_ms, is_blank, validate_inputs
from recalltrace.scorers._result import ScoreResult

Measure = Literal["levenshtein", "hamming", "jaro", "jaro_winkler"]

_lcs = LCSseq.similarity


def _candidates(
    reference: str, retrieved: list[str], lengths: list[int], threshold: float, cutoff: int
) -> list[tuple[float, int, int]]:
    """The retrieved contexts whose similarity bound for ``reference`` exceeds ``threshold``, as
    ``(bound, index, common)`` triples (``common``: the LCS length), highest bound first and, for
    equal bounds, in retrieval order.

    ``cutoff`` is an LCS length that every candidate pair needs; RapidFuzz then computes only a
    diagonal band of each pair's matrix and leaves out the pairs below it. ``reference`` must not
    equal a retrieved context (the caller matches those first): then a pair with no common
    character has a bound of 0 and is never a candidate.
    """
    length = len(reference)
    out = []
    for _, common, index in process.extract(
        reference, retrieved, scorer=_lcs, score_cutoff=cutoff, limit=None
    ):
        other = lengths[index]
        longest = length if length > other else other
        # The bound is computed exactly as the similarity would be: 1 - (longest - LCS) / longest.
        bound = 1.0 - (longest - common) / longest if longest else 1.0
        if bound > threshold:
            out.append((bound, index, common))
    if len(out) > 1:
        out.sort(key=lambda triple: (-triple[0], triple[1]))
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
        if threshold >= 1.0:  # no similarity is strictly above 1
            return [(None, None)] * len(references)
        # A reference context retrieved verbatim (a golden chunk, typically) has similarity 1
        # with its first copy, which no other context can beat: no LCS needed for it. Built from
        # the back, the mapping keeps each context's first index.
        first_copy = dict(zip(reversed(retrieved), range(len(retrieved) - 1, -1, -1), strict=True))
        lengths = [len(context) for context in retrieved]
        shortest = min(lengths)
        out = []
        for reference in references:
            copy = first_copy.get(reference)
            if copy is not None:
                out.append((copy, 1.0))
                continue
            # Every candidate needs an LCS above threshold x the pair's longer length, hence
            # above threshold x max(this length, the shortest retrieved length).
            length = len(reference)
            cutoff = int(threshold * (length if length > shortest else shortest))
            best_index: int | None = None
            best = -1.0
            for upper, index, common in _candidates(
                reference, retrieved, lengths, threshold, cutoff
            ):
                if upper <= best:
                    break  # sorted by bound: no later candidate can beat the best
                similarity = _levenshtein_similarity(reference, retrieved[index], common)
                if similarity > best:
                    best_index, best = index, similarity
            out.append((best_index, best) if best > threshold else (None, None))
        return out

    def _compute(self, clean: dict[str, Any], started: float) -> ScoreResult:
        missing = self.missing_input(clean)
        if missing is not None or is_blank(clean["reference_contexts"]):
            return missing or self.skipped("The trace has no reference contexts to recall.")
        references: list[str] = clean["reference_contexts"]
        retrieved: list[str] = clean["retrieved_contexts"] or []
        total = len(references)
        best: list[tuple[int | None, float | None]] = (
            self._best_matches(references, retrieved) if retrieved else [(None, None)] * total
        )
        matches = [
            {
                "reference_index": ref_index,
                "found": match_index is not None,
                "retrieved_index": match_index,
                "similarity": similarity,
            }
            for ref_index, (match_index, similarity) in enumerate(best)
        ]
        found = sum(match_index is not None for match_index, _ in best)
        if retrieved:
            reason = (
                f"{found} of {total} reference contexts matched a retrieved context with "
                f"{self.measure} similarity above {self.threshold:g}."
            )
        else:
            reason = f"Nothing was retrieved, so none of the {total} reference contexts were found."
        return self.scored(
            found / total,
            reason,
            details={"measure": self.measure, "threshold": self.threshold, "matches": matches},
            latency_ms=elapsed_ms(started),
        )


SCORER = NonLLMContextRecall
