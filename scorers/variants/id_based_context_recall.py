"""``id_based_context_recall``: the share of distinct reference document ids that were
retrieved. No judge."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from recalltrace.scorers._base import BaseScorer, elapsed_ms, is_blank, validate_inputs
from recalltrace.scorers._result import ScoreResult


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


SCORER = IDBasedContextRecall
