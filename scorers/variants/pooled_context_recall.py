"""``pooled_context_recall``: retrieval recall without a reference, estimated by pooling.

A pool is a deeper or other retrieval for the same request (``@retrieval(pool=...)``, run after
the request). The judge grades every document of pool ∪ retrieved for its relevance to the
question (0 not relevant, 1 partly relevant, 2 relevant, with a reason), a few documents per
call. The score is the relevant retrieved documents over the relevant documents of pool ∪
retrieved: recall relative to the pool, an upper bound on true recall (a relevant document
neither retrieval found is not counted). Judgments are kept by (question, document text, judge
model, prompt version), in the worker's database when it has one, so a repeated document and a
re-score cost no call.

Changing the prompt, the schema, the parsing or the formula means bumping the version in the
catalog row (and :data:`PROMPT_VERSION` for the prompt, which is part of the judgments' key).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from recalltrace.scorers import _prompts as prompts
from recalltrace.scorers._base import elapsed_ms, validate_inputs
from recalltrace.scorers._cache import DEFAULT_CACHE, ReferenceCache, cache_key
from recalltrace.scorers._judge import JudgeClient
from recalltrace.scorers._llm import (
    InvalidAnswer,
    LLMScorer,
    _Accounting,
    _index,
    _list_field,
    _plural,
    _text,
    gather_all,
)
from recalltrace.scorers._prompts import JudgeTask, object_schema
from recalltrace.scorers._result import ScoreResult

logger = logging.getLogger("recalltrace.scorers")

#: Bump when the relevance prompt changes; part of every judgment's key.
PROMPT_VERSION = "1"

GRADES = (0, 1, 2)
"""0 not relevant, 1 partly relevant, 2 relevant."""

DOCUMENT_RELEVANCE = JudgeTask(
    "document_relevance",
    system=(
        "Grade each document's relevance to the question. grade 2: it answers the question or "
        "holds information needed to answer it; 1: partly relevant (some needed information, or "
        "closely related); 0: not relevant. reason: one short sentence. Grade every id once, "
        "each document on its own.\n"
        'JSON only: {"grades":[{"id":0,"grade":2,"reason":"States the refund period."}]}'
    ),
    schema=object_schema(
        {
            "grades": {
                "type": "array",
                "items": object_schema(
                    {
                        "id": {"type": "integer"},
                        "grade": {"type": "integer", "enum": list(GRADES)},
                        "reason": {"type": "string"},
                    }
                ),
            }
        }
    ),
)

TASKS: tuple[JudgeTask, ...] = (DOCUMENT_RELEVANCE,)
"""The judge tasks of this variant (the test judge server answers each)."""

#: Inputs read besides the catalog's ``needs`` (optional: documents without ids are matched by
#: their text).
_OPTIONAL_INPUTS = ("retrieved_context_ids", "pool_context_ids")


# -- the kept judgments ----------------------------------------------------------------------------


class Judgments(Protocol):
    """Where graded judgments are kept, by key (see :func:`judgment_key`)."""

    async def find(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The judgments stored under ``keys`` (keys not stored are absent)."""
        ...

    async def keep(self, answers: dict[str, dict[str, Any]]) -> None:
        """Store ``answers`` by key (a key stored already keeps its first answer)."""
        ...


class MemoryJudgments:
    """Judgments kept in this process (the default outside a worker), at most
    ``max_entries``, the least recently used dropped first."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.max_entries = max_entries

    async def find(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        found = {}
        for key in keys:
            if key in self._data:
                self._data.move_to_end(key)
                found[key] = self._data[key]
        return found

    async def keep(self, answers: dict[str, dict[str, Any]]) -> None:
        for key, answer in answers.items():
            self._data.setdefault(key, answer)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)


class DatabaseJudgments:
    """Judgments kept in a database's ``judgments`` table, reached through ``db_call`` (the
    worker's database threads). A failing read or write is logged and the judge is asked (or
    the answer used unkept): the cache never fails a score."""

    def __init__(self, store: Any, db_call: Callable[..., Any]) -> None:
        self._store = store
        self._db_call = db_call

    async def find(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        try:
            found: dict[str, dict[str, Any]] = await self._db_call(self._store.find, list(keys))
        except Exception as exc:
            logger.warning("reading kept relevance judgments failed (%s); asking the judge", exc)
            return {}
        return found

    async def keep(self, answers: dict[str, dict[str, Any]]) -> None:
        try:
            await self._db_call(self._store.keep, answers)
        except Exception as exc:
            logger.warning("keeping relevance judgments failed (%s); they are used unkept", exc)


def judgment_key(question: str, document: str, model: str) -> str:
    """The key of a judgment: a digest of the question, the document's text, the judge model
    and the prompt version."""
    return cache_key(DOCUMENT_RELEVANCE.name, model, PROMPT_VERSION, f"{question}\x00{document}")


# -- pool ∪ retrieved ------------------------------------------------------------------------------


@dataclass
class _Document:
    """One distinct document of pool ∪ retrieved."""

    text: str
    id: str | None
    retrieved_rank: int | None = None
    pool_rank: int | None = None
    grade: int = 0
    reason: str = ""


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def union(
    retrieved: Sequence[str],
    retrieved_ids: Sequence[str] | None,
    pool: Sequence[str],
    pool_ids: Sequence[str] | None,
) -> list[_Document]:
    """The distinct documents of retrieved then pool: the same id, else the same text
    (whitespace and case aside), is one document. Ranks are 1-based; blank texts are left out."""
    documents: list[_Document] = []
    by_id: dict[str, _Document] = {}
    by_text: dict[str, _Document] = {}

    def add(text: str, doc_id: str | None, rank: int, retrieved_side: bool) -> None:
        if not text.strip():
            return
        found = by_id.get(doc_id) if doc_id is not None else None
        if found is None:
            found = by_text.get(_normal(text))
        if found is None:
            found = _Document(text, doc_id)
            documents.append(found)
        if retrieved_side and found.retrieved_rank is None:
            found.retrieved_rank = rank
        if not retrieved_side and found.pool_rank is None:
            found.pool_rank = rank
        if doc_id is not None:
            by_id.setdefault(doc_id, found)
            found.id = found.id or doc_id
        by_text.setdefault(_normal(text), found)

    for side, texts, ids in ((True, retrieved, retrieved_ids), (False, pool, pool_ids)):
        usable = ids if ids is not None and len(ids) == len(texts) else None
        for index, text in enumerate(texts):
            add(text, None if usable is None else str(usable[index]), index + 1, side)
    return documents


# -- the answer --------------------------------------------------------------------------------


def _grades_parser(count: int) -> Callable[[dict[str, Any]], list[tuple[int, str]]]:
    def parse(data: dict[str, Any]) -> list[tuple[int, str]]:
        grades: dict[int, tuple[int, str]] = {}
        for index, item in enumerate(_list_field(data, "grades")):
            if not isinstance(item, dict):
                raise InvalidAnswer(f"Grade {index} is not an object.")
            doc = _index(item.get("id"), f"grades[{index}].id")
            if not 0 <= doc < count:
                raise InvalidAnswer(f"Document id {doc} does not exist (ids are 0 to {count - 1}).")
            if doc in grades:
                raise InvalidAnswer(f"Document id {doc} was graded twice.")
            grade = item.get("grade")
            if isinstance(grade, bool) or grade not in GRADES:
                raise InvalidAnswer(f"grades[{index}].grade must be 0, 1 or 2, not {grade!r}.")
            reason = _text(item.get("reason"), f"grades[{index}].reason")
            grades[doc] = (int(grade), reason)
        absent = [i for i in range(count) if i not in grades]
        if absent:
            raise InvalidAnswer(f"Document ids {absent} were not graded.")
        return [grades[i] for i in range(count)]

    return parse


class PooledContextRecall(LLMScorer):
    """Recall of the retrieval relative to a pool, with no reference (see the module)."""

    key = "pooled_context_recall"

    def __init__(
        self,
        judge: JudgeClient,
        *,
        samples: int = 1,
        cache: ReferenceCache | None = DEFAULT_CACHE,
        batch_size: int = 5,
        threshold: int = 1,
        judgments: Judgments | None = None,
    ) -> None:
        """Create the scorer.

        Args:
            judge: the client that calls the judge model.
            samples: grade each batch this many times and take the median grade per document.
            cache: unused by this variant (its judgments are kept in ``judgments``); accepted
                like every LLM variant's.
            batch_size: documents graded per judge call (1 to 20).
            threshold: the lowest grade that counts as relevant (1: partly relevant or
                relevant; 2: relevant only).
            judgments: where judgments are kept; default this process's memory (a worker
                keeps them in its database).
        """
        super().__init__(judge, samples=samples, cache=cache)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise ValueError("batch_size must be an integer from 1 to 20")
        if not 1 <= batch_size <= 20:
            raise ValueError(f"batch_size must be from 1 to 20, got {batch_size}")
        if threshold not in (1, 2) or isinstance(threshold, bool):
            raise ValueError(f"threshold must be 1 or 2, got {threshold!r}")
        self.batch_size = batch_size
        self.threshold = threshold
        self.judgments: Judgments = judgments if judgments is not None else MemoryJudgments()

    def bind_storage(self, repo: Any, db_call: Callable[..., Any]) -> None:
        """Keep judgments in ``repo``'s database (a worker calls this with its repository and
        the function that runs database calls off its event loop)."""
        from sqlalchemy import Engine

        from recalltrace.storage.pools import JudgmentStore

        engine = getattr(repo, "engine", None)
        if isinstance(engine, Engine):
            self.judgments = DatabaseJudgments(JudgmentStore(engine), db_call)

    async def ascore(self, **inputs: Any) -> ScoreResult:
        """Score one trace; reads ``retrieved_context_ids`` and ``pool_context_ids`` besides
        the needed inputs, when given, to match documents by id."""
        started = time.perf_counter()
        clean = validate_inputs((*self.needs, *_OPTIONAL_INPUTS), inputs)
        result = await self._ascore(clean, started)
        if result.latency_ms is None:
            result = replace(result, latency_ms=elapsed_ms(started))
        return result

    async def _judge(
        self, clean: dict[str, Any], accounting: _Accounting, started: float
    ) -> ScoreResult:
        question: str = clean["user_input"]
        documents = union(
            clean["retrieved_contexts"],
            clean.get("retrieved_context_ids"),
            clean["pool_contexts"],
            clean.get("pool_context_ids"),
        )
        cached = await self._grade(question, documents, accounting)
        relevant = [d for d in documents if d.grade >= self.threshold]
        found = [d for d in relevant if d.retrieved_rank is not None]
        missed = sorted(
            (d for d in relevant if d.retrieved_rank is None),
            key=lambda d: d.pool_rank or 0,
        )
        details: dict[str, Any] = {
            "pool_size": len(clean["pool_contexts"]),
            "retrieved": len(clean["retrieved_contexts"]),
            "judged": len(documents),
            "judged_from_cache": cached,
            "threshold": self.threshold,
            "relevant_retrieved": [
                {
                    "retrieved_rank": d.retrieved_rank,
                    "pool_rank": d.pool_rank,
                    "id": d.id,
                    "grade": d.grade,
                }
                for d in sorted(found, key=lambda d: d.retrieved_rank or 0)
            ],
            "missed": [
                {
                    "pool_rank": d.pool_rank,
                    "id": d.id,
                    "grade": d.grade,
                    "reason": d.reason,
                    "text": d.text[:300],
                }
                for d in missed
            ],
        }
        if not relevant:
            return self.skipped(
                f"The judge found no relevant document among the "
                f"{_plural(len(documents), 'document')} of the pool and the retrieval, so recall "
                "cannot be estimated.",
                details=details,
                latency_ms=elapsed_ms(started),
                **accounting.fields(),
            )
        reason = (
            f"The retrieval found {len(found)} of the "
            f"{_plural(len(relevant), 'relevant document')} in the pool and the retrieval"
        )
        if missed:
            ranks = ", ".join(str(d.pool_rank) for d in missed[:5])
            reason += f"; it missed pool rank(s) {ranks}{' ...' if len(missed) > 5 else ''}."
        else:
            reason += "."
        return self.finish(len(found) / len(relevant), reason, details, accounting, started)

    async def _grade(
        self, question: str, documents: list[_Document], accounting: _Accounting
    ) -> int:
        """Grade ``documents`` in place: kept judgments first, the judge for the rest (a few
        documents per call, the calls concurrent); returns how many were kept already."""
        model = self.judge.model
        keys = [judgment_key(question, d.text, model) for d in documents]
        kept = await self.judgments.find(list(dict.fromkeys(keys)))
        todo: dict[str, _Document] = {}
        for key, doc in zip(keys, documents, strict=True):
            answer = kept.get(key)
            if answer is not None and answer.get("grade") in GRADES:
                doc.grade, doc.reason = int(answer["grade"]), str(answer.get("reason") or "")
            else:
                todo.setdefault(key, doc)
        if todo:
            items = list(todo.items())
            batches = [
                items[start : start + self.batch_size]
                for start in range(0, len(items), self.batch_size)
            ]
            graded = await gather_all(
                [self._grade_batch(question, batch, accounting) for batch in batches]
            )
            fresh: dict[str, dict[str, Any]] = {}
            for batch, grades in zip(batches, graded, strict=True):
                for (key, doc), (grade, reason) in zip(batch, grades, strict=True):
                    doc.grade, doc.reason = grade, reason
                    fresh[key] = {"grade": grade, "reason": reason}
            await self.judgments.keep(fresh)
            # Documents sharing a text with one just graded take its grade.
            for key, doc in zip(keys, documents, strict=True):
                if key in fresh:
                    doc.grade, doc.reason = fresh[key]["grade"], fresh[key]["reason"]
        return sum(1 for key in keys if key in kept)

    async def _grade_batch(
        self, question: str, batch: list[tuple[str, _Document]], accounting: _Accounting
    ) -> list[tuple[int, str]]:
        user = prompts.tagged(
            question=question, context=prompts.numbered([doc.text for _, doc in batch])
        )
        parse = _grades_parser(len(batch))
        runs = await asyncio.gather(
            *[self.ask(DOCUMENT_RELEVANCE, user, parse, accounting) for _ in range(self.samples)]
        )
        if len(runs) == 1:
            return list(runs[0])
        merged = []
        for index in range(len(batch)):
            grade = int(statistics.median_low(run[index][0] for run in runs))
            reason = next(run[index][1] for run in runs if run[index][0] == grade)
            merged.append((grade, reason))
        return merged


SCORER = PooledContextRecall
