"""``judge_context_recall``: one holistic judge score in [0, 1] of how well the answer matches
the reference given the retrieved context.

The variant whole: its judge tasks (prompt and answer schema), their parsers and the scorer.
Changing a prompt, a schema or the parsing means bumping the version in its catalog row.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from recalltrace.scorers import _prompts as prompts
from recalltrace.scorers._llm import (
    InvalidAnswer,
    LLMScorer,
    _Accounting,
    _contexts,
    _text,
    gather_all,
)
from recalltrace.scorers._prompts import JudgeTask, object_schema
from recalltrace.scorers._result import ScoreResult

JUDGE_RECALL = JudgeTask(
    "judge_recall",
    system=(
        "Score how well the response matches the expected answer, given the question and context, "
        "as context_recall_score: 0.0 unrelated; 0.1-0.3 minimally relevant, misses key points; "
        "0.4-0.6 partly correct, lacks detail or accuracy; 0.7-0.9 mostly accurate, minor "
        "discrepancies; 1.0 full match. Reason: one sentence.\n"
        'JSON only: {"context_recall_score":0.0,"reason":"..."}'
    ),
    schema=object_schema(
        {"context_recall_score": {"type": "number"}, "reason": {"type": "string"}}
    ),
)

TASKS: tuple[JudgeTask, ...] = (JUDGE_RECALL,)
"""The judge tasks of this variant (the test judge server answers each)."""


def _parse_judge(data: dict[str, Any]) -> tuple[float, str]:
    score = data.get("context_recall_score")
    if isinstance(score, str):
        try:
            score = float(score.strip())
        except ValueError:
            raise InvalidAnswer(f"context_recall_score {score!r} is not a number.") from None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise InvalidAnswer("The answer has no numeric context_recall_score.")
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        raise InvalidAnswer(f"context_recall_score {score!r} is outside [0, 1].")
    return float(score), _text(data.get("reason"), "reason")


class JudgeContextRecall(LLMScorer):
    """One holistic judge score in [0, 1] of how well the response matches the expected answer
    given the retrieved context, with the judge's reason."""

    key = "judge_context_recall"

    async def _judge(
        self, clean: dict[str, Any], accounting: _Accounting, started: float
    ) -> ScoreResult:
        contexts = _contexts(clean)
        if not contexts:
            return self.nothing_retrieved(accounting, started)
        user = prompts.tagged(
            question=clean["user_input"],
            context=prompts.joined(contexts),
            expected_answer=clean["reference"],
            response=clean["response"],
        )
        runs = await gather_all(
            [self.ask(JUDGE_RECALL, user, _parse_judge, accounting) for _ in range(self.samples)]
        )
        scores = [score for score, _ in runs]
        value = statistics.median(scores)
        reason = min(runs, key=lambda run: abs(run[0] - value))[1]
        details: dict[str, Any] = {"judge_reason": reason}
        if len(runs) > 1:
            details["scores"] = scores
            details["agreement"] = round(1.0 - (max(scores) - min(scores)), 4)
        if not reason:
            sentence = f"The judge rated the context recall {value:g}."
        else:
            sentence = reason if reason.endswith((".", "!", "?")) else f"{reason}."
        return self.finish(
            value,
            sentence,
            details,
            accounting,
            started,
        )


SCORER = JudgeContextRecall
