"""``context_entity_recall``: the share of the reference's distinct entities that the retrieved
contexts also mention.

The variant whole: its judge tasks (prompt and answer schema), their parsers and the scorer.
Changing a prompt, a schema or the parsing means bumping the version in its catalog row.
"""

from __future__ import annotations

import statistics
from typing import Any

from recalltrace.scorers import _prompts as prompts
from recalltrace.scorers._base import elapsed_ms
from recalltrace.scorers._cache import DEFAULT_CACHE, ReferenceCache
from recalltrace.scorers._judge import JudgeClient
from recalltrace.scorers._llm import (
    LLMScorer,
    _Accounting,
    _contexts,
    _list_field,
    _majority,
    _text,
    gather_all,
    normalise_entity,
)
from recalltrace.scorers._prompts import JudgeTask, object_schema
from recalltrace.scorers._result import ScoreResult

ENTITIES = JudgeTask(
    "entities",
    system=(
        "List the distinct named entities in the text (people, places, organisations, dates, "
        "quantities, works, products, events), each once, by its full name.\n"
        'JSON only: {"entities":["..."]}'
    ),
    schema=object_schema({"entities": {"type": "array", "items": {"type": "string"}}}),
)

REFERENCE_AND_CONTEXT_ENTITIES = JudgeTask(
    "reference_and_context_entities",
    system=(
        "List the distinct named entities (people, places, organisations, dates, quantities, "
        "works, products, events) of the reference and, separately, of the context, each once "
        "by its full name. Take each list from its own text only; name an entity both texts "
        "mention the same way in both lists.\n"
        'JSON only: {"reference_entities":["..."],"context_entities":["..."]}'
    ),
    schema=object_schema(
        {
            "reference_entities": {"type": "array", "items": {"type": "string"}},
            "context_entities": {"type": "array", "items": {"type": "string"}},
        }
    ),
)

TASKS: tuple[JudgeTask, ...] = (
    ENTITIES,
    REFERENCE_AND_CONTEXT_ENTITIES,
)
"""The judge tasks of this variant (the test judge server answers each)."""


def _parse_entities(data: dict[str, Any], name: str = "entities") -> list[str]:
    entities: dict[str, str] = {}
    for index, item in enumerate(_list_field(data, name)):
        text = _text(item, f"{name}[{index}]")
        if text:
            entities.setdefault(normalise_entity(text), text)
    return list(entities.values())


def _parse_both_entities(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    return _parse_entities(data, "reference_entities"), _parse_entities(data, "context_entities")


class ContextEntityRecall(LLMScorer):
    """Share of the reference's distinct entities that the retrieved contexts also mention.

    Entities are compared case-folded with whitespace collapsed. By default one call lists the
    entities of the reference and of the contexts together, so the judge names an entity the
    same way in both lists. With ``split_reference=True`` (always when ``samples > 1``) the
    reference's entities come from a call of their own, cached per reference text, and the
    contexts' from another.
    """

    key = "context_entity_recall"

    def __init__(
        self,
        judge: JudgeClient,
        *,
        samples: int = 1,
        split_reference: bool = False,
        cache: ReferenceCache | None = DEFAULT_CACHE,
    ) -> None:
        """See :class:`LLMScorer`; ``split_reference`` caches the reference's entities."""
        super().__init__(judge, samples=samples, cache=cache)
        self.split_reference = bool(split_reference) or samples > 1

    async def _judge(
        self, clean: dict[str, Any], accounting: _Accounting, started: float
    ) -> ScoreResult:
        reference: str = clean["reference"]
        contexts = _contexts(clean)
        context_text = prompts.joined(contexts)
        runs: list[list[str]] = []
        if contexts and not self.split_reference:
            ref_entities, context_entities = await self.ask(
                REFERENCE_AND_CONTEXT_ENTITIES,
                prompts.tagged(reference=reference, context=context_text),
                _parse_both_entities,
                accounting,
            )
            runs = [context_entities]
            details: dict[str, Any] = {"mode": "one_call"}
        else:
            reference_call = self.ask_reference(
                ENTITIES,
                prompts.tagged(text=reference),
                reference,
                _parse_entities,
                accounting,
            )
            # With nothing retrieved only the reference is asked about: a reference without
            # entities is skipped rather than scored against nothing.
            context_user = prompts.tagged(text=context_text)
            context_calls = [
                self.ask(ENTITIES, context_user, _parse_entities, accounting)
                for _ in range(self.samples if contexts else 0)
            ]
            (ref_entities, cached), *runs = await gather_all([reference_call, *context_calls])
            details = {"mode": "split_reference", "reference_cache": cached}
        if not ref_entities:
            return self.skipped(
                "The reference names no entities, so there is nothing to recall.",
                details={**details, "reference_entities": []},
                latency_ms=elapsed_ms(started),
                **accounting.fields(),
            )
        if not runs:
            return self.nothing_retrieved(
                accounting, started, {**details, "reference_entities": ref_entities}
            )
        found_sets = [{normalise_entity(e) for e in run} for run in runs]
        found: list[str] = []
        missing: list[str] = []
        shares = []
        for entity in ref_entities:
            verdict, share = _majority([normalise_entity(entity) in s for s in found_sets])
            (found if verdict else missing).append(entity)
            shares.append(share)
        details.update(
            {
                "reference_entities": ref_entities,
                "context_entities": runs[0] if len(runs) == 1 else runs,
                "found_entities": found,
                "missing_entities": missing,
            }
        )
        if self.samples > 1:
            details["agreement"] = round(statistics.fmean(shares), 4)
        total = len(ref_entities)
        return self.finish(
            len(found) / total,
            f"{len(found)} of {total} reference entities appear in the retrieved contexts.",
            details,
            accounting,
            started,
        )


SCORER = ContextEntityRecall
