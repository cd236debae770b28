"""The judge prompts and the JSON schemas of their answers.

Every prompt token is paid for on every trace, so the instructions are short and the inputs go in
light tags. Each prompt states its output shape in one line, which serves JSON mode (where no
schema can be sent) and keeps answers the same shape across providers. Changing a prompt, a
schema or the parsing means bumping the variant's version in ``scorers.catalog``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Bump when any prompt text below changes; part of the reference cache key.
PROMPT_VERSION = "1"

CLAIMS_WITH_VERDICTS = (
    "Split the reference into short self-contained claims (resolve pronouns). For each claim, "
    "attributed is 1 if the context states or implies it, else 0; use the context only, not "
    "your knowledge. Reasons: under 12 words.\n"
    'JSON only: {"claims":[{"statement":"...","reason":"...","attributed":0}]}'
)

REFERENCE_CLAIMS = (
    "Split the reference into short self-contained claims, one fact each (resolve pronouns).\n"
    'JSON only: {"claims":["..."]}'
)

CLAIM_VERDICTS = (
    "For each numbered claim, attributed is 1 if the context states or implies it, else 0; use "
    "the context only, not your knowledge. One verdict per claim id; reasons under 12 words.\n"
    'JSON only: {"verdicts":[{"claim":0,"reason":"...","attributed":0}]}'
)

ENTITIES = (
    "List the distinct named entities in the text (people, places, organisations, dates, "
    "quantities, works, products, events), each once, by its full name.\n"
    'JSON only: {"entities":["..."]}'
)

REFERENCE_AND_CONTEXT_ENTITIES = (
    "List the distinct named entities (people, places, organisations, dates, quantities, works, "
    "products, events) of the reference and, separately, of the context, each once by its full "
    "name. Take each list from its own text only; name an entity both texts mention the same "
    "way in both lists.\n"
    'JSON only: {"reference_entities":["..."],"context_entities":["..."]}'
)

CHUNK_RECALL = (
    "For every chunk id: is_relevant: it helps answer the question; is_included: its key "
    "information is in the answer (meaning, not wording); missing_info: if relevant but not "
    "included, the key information the answer lacks, else null. Evaluate each id once.\n"
    'JSON only: {"evaluated_chunks":[{"id_chunk":0,"is_relevant":true,"is_included":false,'
    '"missing_info":null}]}'
)

JUDGE_RECALL = (
    "Score how well the response matches the expected answer, given the question and context, "
    "as context_recall_score: 0.0 unrelated; 0.1-0.3 minimally relevant, misses key points; "
    "0.4-0.6 partly correct, lacks detail or accuracy; 0.7-0.9 mostly accurate, minor "
    "discrepancies; 1.0 full match. Reason: one sentence.\n"
    'JSON only: {"context_recall_score":0.0,"reason":"..."}'
)

RETRY_NOTE = "Your reply was invalid: {problem} Answer again, JSON only, in the required shape."


def joined(items: Sequence[str]) -> str:
    """Passages separated by blank lines, where the judge never needs to refer to one by id."""
    return "\n\n".join(items)


def numbered(items: Sequence[str]) -> str:
    """Items on their own lines as ``[0] text``, ``[1] text``: the ids the judge refers to."""
    return "\n".join(f"[{index}] {item}" for index, item in enumerate(items))


def tagged(**parts: str) -> str:
    """Inputs wrapped in light tags, e.g. ``<question>...</question>``, in the given order."""
    return "\n".join(f"<{name}>\n{text}\n</{name}>" for name, text in parts.items())


def messages(system: str, user: str) -> list[dict[str, Any]]:
    """A system and a user message in the chat format."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    # Strict structured output wants every property required and nothing else allowed.
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "claims_with_verdicts": _object(
        {
            "claims": {
                "type": "array",
                "items": _object(
                    {
                        "statement": {"type": "string"},
                        "reason": {"type": "string"},
                        "attributed": {"type": "integer", "enum": [0, 1]},
                    }
                ),
            }
        }
    ),
    "reference_claims": _object({"claims": {"type": "array", "items": {"type": "string"}}}),
    "claim_verdicts": _object(
        {
            "verdicts": {
                "type": "array",
                "items": _object(
                    {
                        "claim": {"type": "integer"},
                        "reason": {"type": "string"},
                        "attributed": {"type": "integer", "enum": [0, 1]},
                    }
                ),
            }
        }
    ),
    "entities": _object({"entities": {"type": "array", "items": {"type": "string"}}}),
    "reference_and_context_entities": _object(
        {
            "reference_entities": {"type": "array", "items": {"type": "string"}},
            "context_entities": {"type": "array", "items": {"type": "string"}},
        }
    ),
    "chunk_recall": _object(
        {
            "evaluated_chunks": {
                "type": "array",
                "items": _object(
                    {
                        "id_chunk": {"type": "integer"},
                        "is_relevant": {"type": "boolean"},
                        "is_included": {"type": "boolean"},
                        "missing_info": {"type": ["string", "null"]},
                    }
                ),
            }
        }
    ),
    "judge_recall": _object(
        {"context_recall_score": {"type": "number"}, "reason": {"type": "string"}}
    ),
}
