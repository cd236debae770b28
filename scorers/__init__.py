"""Context-recall scorers for production RAG traces, and the judge client they share.

Cheap to import: LiteLLM is loaded on the first judge call, not here.

    import scorers

    scorer = scorers.get("non_llm_context_recall", threshold=0.5)
    result = scorer.score(retrieved_contexts=[...], reference_contexts=[...])

    judge = scorers.JudgeClient(scorers.JudgeConfig(model="openai/gpt-4o-mini"))
    scorer = scorers.get("llm_context_recall", judge=judge)
    result = await scorer.ascore(user_input=..., retrieved_contexts=[...], reference=...)
"""

from __future__ import annotations

from scorers._base import Scorer
from scorers._cache import ReferenceCache
from scorers._errors import JudgeError, ScorerInputError, TerminalJudgeError, TransientJudgeError
from scorers._judge import JudgeCallRecord, JudgeClient, JudgeConfig, load_judge_backend
from scorers._registry import available, get
from scorers._result import ScoreResult

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
