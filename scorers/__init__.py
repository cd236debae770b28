"""Context-recall scorers for production RAG traces, and the judge client they share.

Cheap to import: LiteLLM is loaded on the first judge call, not here.

    from recalltrace import scorers

    scorer = scorers.get("non_llm_context_recall", threshold=0.5)
    result = scorer.score(retrieved_contexts=[...], reference_contexts=[...])

    judge = scorers.JudgeClient(scorers.JudgeConfig(model="openai/gpt-4o-mini"))
    scorer = scorers.get("llm_context_recall", judge=judge)
    result = await scorer.ascore(user_input=..., retrieved_contexts=[...], reference=...)
"""

from __future__ import annotations

from recalltrace.scorers._base import Scorer
from recalltrace.scorers._cache import ReferenceCache
from recalltrace.scorers._errors import (
    JudgeError,
    ScorerInputError,
    TerminalJudgeError,
    TransientJudgeError,
)
from recalltrace.scorers._judge import JudgeCallRecord, JudgeClient, JudgeConfig, load_judge_backend
from recalltrace.scorers._registry import available, get
from recalltrace.scorers._result import ScoreResult

__all__ = [
    "JudgeCallRecord",
    "JudgeClient",
    "JudgeConfig",
    "JudgeError",
    "ReferenceCache",
    "ScoreResult",
    "Scorer",
    "ScorerInputError",
    "TerminalJudgeError",
    "TransientJudgeError",
    "available",
    "get",
    "load_judge_backend",
]
