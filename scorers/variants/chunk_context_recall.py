"""``chunk_context_recall``: the share of relevant retrieved chunks whose key information the
answer reflects (no reference needed).

The variant whole: its judge tasks (prompt and answer schema), their parsers and the scorer.
Changing a prompt, a schema or the parsing means bumping the version in its catalog row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from recalltrace.scorers import _prompts as prompts
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

CHUNK_RECALL = JudgeTask(
    "chunk_recall",
    system=(
        "For every chunk id: is_relevant: it helps answer the question; is_included: its key "
        "information is in the answer (meaning, not wording); missing_info: if relevant but not "
        "included, the key information the answer lacks, else null. Evaluate each id once.\n"
        'JSON only: {"evaluated_chunks":[{"id_chunk":0,"is_relevant":true,"is_included":false,'
        '"missing_info":null}]}'
    ),
    schema=object_schema(
        {
            "evaluated_chunks": {
                "type": "array",
                "items": object_schema(
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
)

TASKS: tuple[JudgeTask, ...] = (CHUNK_RECALL,)
"""The judge tasks of this variant (the test judge server answers each)."""


def _chunks_parser(count: int) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    def parse(data: dict[str, Any]) -> list[dict[str, Any]]:
        chunks: dict[int, dict[str, Any]] = {}
        for index, item in enumerate(_list_field(data, "evaluated_chunks")):
            if not isinstance(item, dict):
                raise InvalidAnswer(f"Chunk verdict {index} is not an object.")
            chunk = _index(item.get("id_chunk"), f"evaluated_chunks[{index}].id_chunk")
            if not 0 <= chunk < count:
                raise InvalidAnswer(f"Chunk id {chunk} does not exist (ids are 0 to {count - 1}).")
            if chunk in chunks:
                raise InvalidAnswer(f"Chunk id {chunk} was evaluated twice.")
            relevant = _flag(item.get("is_relevant"), f"evaluated_chunks[{index}].is_relevant")
            included = _flag(item.get("is_included"), f"evaluated_chunks[{index}].is_included")
            missing = _text(item.get("missing_info"), f"evaluated_chunks[{index}].missing_info")
            chunks[chunk] = {
                "id_chunk": chunk,
                "is_relevant": relevant,
                "is_included": included,
                "missing_info": missing if relevant and not included and missing else None,
            }
        absent = [i for i in range(count) if i not in chunks]
        if absent:
            raise InvalidAnswer(f"Chunk ids {absent} were not evaluated.")
        return [chunks[i] for i in range(count)]

    return parse


class ChunkContextRecall(LLMScorer):
    """Share of the relevant retrieved chunks whose key information the answer reflects.

    Needs no reference: the direction is retrieved context -> generated answer.
    """

    key = "chunk_context_recall"

    async def _judge(
        self, clean: dict[str, Any], accounting: _Accounting, started: float
    ) -> ScoreResult:
        contexts = clean["retrieved_contexts"]
        if not _contexts(clean):  # none, or only blank ones: no chunk has information to miss
            return self.skipped("Nothing was retrieved, so no chunk's information can be missed.")
        user = prompts.tagged(
            question=clean["user_input"],
            context=prompts.numbered(contexts),
            answer=clean["response"],
        )
        parse = _chunks_parser(len(contexts))
        runs = await gather_all(
            [self.ask(CHUNK_RECALL, user, parse, accounting) for _ in range(self.samples)]
        )
        chunks = runs[0]
        shares: list[float] = []
        if len(runs) > 1:
            chunks = []
            for index in range(len(contexts)):
                relevant, share_r = _majority([run[index]["is_relevant"] for run in runs])
                included, share_i = _majority([run[index]["is_included"] for run in runs])
                missing = next(
                    (run[index]["missing_info"] for run in runs if run[index]["missing_info"]),
                    None,
                )
                chunks.append(
                    {
                        "id_chunk": index,
                        "is_relevant": relevant,
                        "is_included": included,
                        "missing_info": missing if relevant and not included else None,
                    }
                )
                shares.extend((share_r, share_i))
        relevant_chunks = [c for c in chunks if c["is_relevant"]]
        details: dict[str, Any] = {
            "evaluated_chunks": chunks,
            "missing_information": [
                {"chunk_id": c["id_chunk"], "missing_info": c["missing_info"]}
                for c in relevant_chunks
                if not c["is_included"] and c["missing_info"]
            ],
        }
        if shares:
            details["agreement"] = round(statistics.fmean(shares), 4)
        if not relevant_chunks:
            return self.finish(
                1.0,
                f"None of the {_plural(len(chunks), 'retrieved chunk')} is relevant to the "
                "question, so the answer misses nothing (1.0 by definition).",
                details,
                accounting,
                started,
            )
        count = sum(1 for c in relevant_chunks if c["is_included"])
        return self.finish(
            count / len(relevant_chunks),
            f"The answer reflects {count} of {_plural(len(relevant_chunks), 'relevant chunk')}.",
            details,
            accounting,
            started,
        )


SCORER = ChunkContextRecall
