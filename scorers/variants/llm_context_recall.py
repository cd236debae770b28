"""``llm_context_recall``: the share of the reference's claims that the retrieved contexts
support, judged by an LLM.

The variant whole: its judge tasks (prompt and answer schema), their parsers and the scorer.
Changing a prompt, a schema or the parsing means bumping the version in its catalog row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from recalltrace.scorers import _prompts as prompts
from recalltrace.scorers._cache import DEFAULT_CACHE, ReferenceCache
from recalltrace.scorers._judge import JudgeClient
from recalltrace.scorers._llm import (
    InvalidAnswer,
    LLMScorer,
    _Accounting,
    _contexts,
    _flag,
    _index,
    _list_field,
    _majority,
    _plural,
    _text,
    gather_all,
)
from recalltrace.scorers._prompts import JudgeTask, object_schema
from recalltrace.scorers._result import ScoreResult

CLAIMS_WITH_VERDICTS = JudgeTask(
    "claims_with_verdicts",
    system=(
        "Split the reference into short self-contained claims (resolve pronouns). For each claim, "
        "attributed is 1 if the context states or implies it, else 0; use the context only, not "
        "your knowledge. Reasons: under 12 words.\n"
        'JSON only: {"claims":[{"statement":"...","reason":"...","attributed":0}]}'
    ),
    schema=object_schema(
        {
            "claims": {
                "type": "array",
                "items": object_schema(
                    {
                        "statement": {"type": "string"},
                        "reason": {"type": "string"},
                        "attributed": {"type": "integer", "enum": [0, 1]},
                    }
                ),
            }
        }
    ),
)

REFERENCE_CLAIMS = JudgeTask(
    "reference_claims",
    system=(
        "Split the reference into short self-contained claims, one fact each (resolve pronouns).\n"
        'JSON only: {"claims":["..."]}'
    ),
    schema=object_schema({"claims": {"type": "array", "items": {"type": "string"}}}),
)

CLAIM_VERDICTS = JudgeTask(
    "claim_verdicts",
    system=(
        "For each numbered claim, attributed is 1 if the context states or implies it, else 0; use "
        "the context only, not your knowledge. One verdict per claim id; reasons under 12 words.\n"
        'JSON only: {"verdicts":[{"claim":0,"reason":"...","attributed":0}]}'
    ),
    schema=object_schema(
        {
            "verdicts": {
                "type": "array",
                "items": object_schema(
                    {
                        "claim": {"type": "integer"},
                        "reason": {"type": "string"},
                        "attributed": {"type": "integer", "enum": [0, 1]},
                    }
                ),
            }
        }
    ),
)

TASKS: tuple[JudgeTask, ...] = (
    CLAIMS_WITH_VERDICTS,
    REFERENCE_CLAIMS,
    CLAIM_VERDICTS,
)
"""The judge tasks of this variant (the test judge server answers each)."""


def _parse_claims_with_verdicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    claims = []
    for index, item in enumerate(_list_field(data, "claims")):
        if not isinstance(item, dict):
            raise InvalidAnswer(f"Claim {index} is not an object.")
        claims.append(
            {
                "statement": _text(
                    item.get("statement"), f"claims[{index}].statement", allow_empty=False
                ),
                "reason": _text(item.get("reason"), f"claims[{index}].reason"),
                "attributed": int(_flag(item.get("attributed"), f"claims[{index}].attributed")),
            }
        )
    if not claims:
        raise InvalidAnswer("The answer listed no claims; the reference has at least one.")
    return claims


def _parse_reference_claims(data: dict[str, Any]) -> list[str]:
    claims = [
        _text(item, f"claims[{index}]", allow_empty=False)
        for index, item in enumerate(_list_field(data, "claims"))
    ]
    if not claims:
        raise InvalidAnswer("The answer listed no claims; the reference has at least one.")
    return claims


def _verdicts_parser(count: int) -> Callable[[dict[str, Any]], list[tuple[int, str]]]:
    def parse(data: dict[str, Any]) -> list[tuple[int, str]]:
        found: dict[int, tuple[int, str]] = {}
        for index, item in enumerate(_list_field(data, "verdicts")):
            if not isinstance(item, dict):
                raise InvalidAnswer(f"Verdict {index} is not an object.")
            claim = _index(item.get("claim"), f"verdicts[{index}].claim")
            if not 0 <= claim < count:
                raise InvalidAnswer(f"Claim id {claim} does not exist (ids are 0 to {count - 1}).")
            if claim in found:
                raise InvalidAnswer(f"Claim id {claim} was judged twice.")
            found[claim] = (
                int(_flag(item.get("attributed"), f"verdicts[{index}].attributed")),
                _text(item.get("reason"), f"verdicts[{index}].reason"),
            )
        missing = [i for i in range(count) if i not in found]
        if missing:
            raise InvalidAnswer(f"Claim ids {missing} have no verdict.")
        return [found[i] for i in range(count)]

    return parse


class LLMContextRecall(LLMScorer):
    """Share of the reference's claims that the retrieved contexts support (judge-based).

    By default one call splits the reference into claims and judges each. With
    ``split_claims=True`` (always when ``samples > 1``) the reference is split into claims by a
    separate call whose result is cached per reference, then the claims are judged.
    """

    key = "llm_context_recall"

    def __init__(
        self,
        judge: JudgeClient,
        *,
        samples: int = 1,
        split_claims: bool = False,
        cache: ReferenceCache | None = DEFAULT_CACHE,
    ) -> None:
        """See :class:`LLMScorer`; ``split_claims`` caches the reference's claims."""
        super().__init__(judge, samples=samples, cache=cache)
        self.split_claims = bool(split_claims) or samples > 1

    async def _judge(
        self, clean: dict[str, Any], accounting: _Accounting, started: float
    ) -> ScoreResult:
        reference: str = clean["reference"]
        question: str = clean["user_input"]
        contexts = _contexts(clean)
        if not contexts:
            return self.nothing_retrieved(accounting, started)
        if not self.split_claims:
            user = prompts.tagged(
                question=question, context=prompts.joined(contexts), reference=reference
            )
            claims = await self.ask(
                CLAIMS_WITH_VERDICTS,
                user,
                _parse_claims_with_verdicts,
                accounting,
            )
            details: dict[str, Any] = {"claims": claims, "mode": "one_call"}
        else:
            statements, cached = await self.ask_reference(
                REFERENCE_CLAIMS,
                prompts.tagged(reference=reference),
                reference,
                _parse_reference_claims,
                accounting,
            )
            user = prompts.tagged(
                question=question,
                context=prompts.joined(contexts),
                claims=prompts.numbered(statements),
            )
            parse = _verdicts_parser(len(statements))
            runs = await gather_all(
                [self.ask(CLAIM_VERDICTS, user, parse, accounting) for _ in range(self.samples)]
            )
            claims = []
            shares = []
            for index, statement in enumerate(statements):
                verdict, share = _majority([bool(run[index][0]) for run in runs])
                reason = next(r for a, r in (run[index] for run in runs) if bool(a) == verdict)
                claims.append(
                    {"statement": statement, "reason": reason, "attributed": int(verdict)}
                )
                shares.append(share)
            details = {"claims": claims, "mode": "split_claims", "reference_cache": cached}
            if self.samples > 1:
                details["agreement"] = round(statistics.fmean(shares), 4)
        attributed = sum(c["attributed"] for c in claims)
        total = len(claims)
        return self.finish(
            attributed / total,
            f"{attributed} of {_plural(total, 'reference claim')} can be attributed to the "
            "retrieved contexts.",
            details,
            accounting,
            started,
        )


SCORER = LLMContextRecall
