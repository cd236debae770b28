"""The four variants that ask a judge model: claims, entities, chunks and a holistic score.

Each answer is parsed and validated before it is scored. An invalid answer (not JSON, cut off,
wrong shape, out-of-range score, wrong chunk ids, no claims) is asked again once with the
problem stated; if the second answer is invalid too, the result is ``failed`` with the reason.
Judge transport errors are not turned into results: they raise ``TransientJudgeError`` or
``TerminalJudgeError`` for the caller to reschedule or pause.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from recalltrace.scorers import _prompts as prompts
from recalltrace.scorers._base import BaseScorer, elapsed_ms
from recalltrace.scorers._cache import DEFAULT_CACHE, ReferenceCache, cache_key
from recalltrace.scorers._judge import JudgeClient, JudgeInputRejected, JudgeReply
from recalltrace.scorers._result import ScoreResult

T = TypeVar("T")


class InvalidAnswer(ValueError):
    """The judge's answer cannot be scored; the message is one sentence naming the problem."""


@dataclass
class _Accounting:
    """Tokens and cost summed over the judge calls made for one result."""

    model: str
    calls: int = 0
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    cost_usd: float | None = 0.0
    cost_known: bool = True

    def add(self, reply: JudgeReply) -> None:
        self.calls += 1
        self.prompt_tokens = _add(self.prompt_tokens, reply.prompt_tokens)
        self.completion_tokens = _add(self.completion_tokens, reply.completion_tokens)
        if reply.cost_usd is None:
            self.cost_known = False
        elif self.cost_usd is not None:
            self.cost_usd += reply.cost_usd

    def fields(self) -> dict[str, Any]:
        if self.calls == 0:
            return {"model": self.model}
        return {
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd if self.cost_known else None,
        }


def _add(total: int | None, value: int | None) -> int | None:
    return None if total is None or value is None else total + value


# ---------------------------------------------------------------------------------------------
# parsing helpers

_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```\s*$", re.S)


def parse_json_object(content: str, finish_reason: str | None = None) -> dict[str, Any]:
    """Parse a judge answer into a JSON object, tolerating a code fence or text around it."""
    if finish_reason == "length":
        raise InvalidAnswer("The answer was cut off at the token limit before the JSON ended.")
    text = content.strip()
    if not text:
        raise InvalidAnswer("The answer was empty.")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise InvalidAnswer("The answer was not JSON.") from None
        try:
            data = json.loads(text[start : end + 1])
        except json.JSONDecodeError as exc:
            raise InvalidAnswer(f"The answer was not valid JSON ({exc.msg}).") from None
    if not isinstance(data, dict):
        raise InvalidAnswer("The answer was JSON but not an object.")
    return data


def _list_field(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list):
        raise InvalidAnswer(f'The answer has no "{name}" list.')
    return value


def _flag(value: Any, what: str) -> bool:
    """A 0/1 or true/false verdict; any truthy number counts as 1, as in Ragas' legacy code."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"1", "0", "true", "false", "yes", "no"}:
        return value.strip().lower() in {"1", "true", "yes"}
    raise InvalidAnswer(f"{what} must be 0/1 or true/false, not {value!r}.")


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidAnswer(f"{what} must be an integer id, not {value!r}.")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise InvalidAnswer(f"{what} must be an integer id, not {value!r}.")


def _text(value: Any, what: str, *, allow_empty: bool = True) -> str:
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise InvalidAnswer(f"{what} must be a non-empty string.")
    return value.strip()


def normalise_entity(entity: str) -> str:
    """Case-folded with whitespace collapsed: how entities are compared."""
    return " ".join(entity.casefold().split())


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _majority(votes: Sequence[bool]) -> tuple[bool, float]:
    """The majority verdict (a tie counts as False) and the share of votes that agree with it."""
    yes = sum(votes)
    verdict = yes * 2 > len(votes)
    agreeing = yes if verdict else len(votes) - yes
    return verdict, agreeing / len(votes)


async def gather_all(calls: Sequence[Awaitable[Any]]) -> list[Any]:
    """Run judge calls concurrently; if one raises, cancel the rest and raise it.

    A single call is awaited in the caller's task: a task of its own and a gather would add
    trips through the event loop's queue, which under load wait for everything else ready.
    """
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


# ---------------------------------------------------------------------------------------------
# the shared base


class LLMScorer(BaseScorer):
    """Base of the variants that ask a judge; handles re-asking, accounting and sampling."""

    def __init__(
        self,
        judge: JudgeClient,
        *,
        samples: int = 1,
        cache: ReferenceCache | None = DEFAULT_CACHE,
    ) -> None:
        """Create the scorer.

        Args:
            judge: the client that calls the judge model.
            samples: judge the trace this many times and take the majority per claim, chunk or
                entity (the median for the holistic score); the agreement goes in ``details``.
            cache: where reference-only work is kept; ``None`` disables caching.
        """
        super().__init__()
        if not isinstance(judge, JudgeClient):
            raise TypeError("judge must be a JudgeClient")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError("samples must be a positive integer")
        self.judge = judge
        self.samples = samples
        self.cache = cache

    async def ask(
        self,
        task: str,
        system: str,
        user: str,
        parse: Callable[[dict[str, Any]], T],
        accounting: _Accounting,
    ) -> T:
        """Ask the judge, validate with ``parse``; on an invalid answer ask once more.

        Raises ``InvalidAnswer`` when both answers are invalid.
        """
        messages = prompts.messages(system, user)
        schema = prompts.SCHEMAS[task]
        problem: InvalidAnswer | None = None
        for attempt in range(2):
            reply = await self.judge.chat(messages, schema_name=task, schema=schema)
            accounting.add(reply)
            try:
                return parse(parse_json_object(reply.content, reply.finish_reason))
            except InvalidAnswer as exc:
                problem = exc
                if attempt == 0:
                    messages = [
                        *messages,
                        {"role": "assistant", "content": reply.content[:4000]},
                        {"role": "user", "content": prompts.RETRY_NOTE.format(problem=exc)},
                    ]
        assert problem is not None
        raise problem

    async def ask_reference(
        self,
        task: str,
        system: str,
        user: str,
        text: str,
        parse: Callable[[dict[str, Any]], T],
        accounting: _Accounting,
    ) -> tuple[T, bool]:
        """Like :meth:`ask` for work that depends only on ``text``: served from the cache."""

        async def compute() -> T:
            return await self.ask(task, system, user, parse, accounting)

        if self.cache is None:
            return await compute(), False
        key = cache_key(task, self.judge.model, prompts.PROMPT_VERSION, text)
        return await self.cache.get_or_compute(key, compute)

    async def _ascore(self, clean: dict[str, Any], started: float) -> ScoreResult:
        skipped = self.missing_input(clean)
        if skipped is not None:
            return skipped
        accounting = _Accounting(model=self.judge.model)
        try:
            result = await self._judge(clean, accounting, started)
        except InvalidAnswer as exc:
            return self.failed(
                f"The judge gave no valid answer after one retry: {exc}",
                latency_ms=elapsed_ms(started),
                **accounting.fields(),
            )
        except JudgeInputRejected as exc:
            return self.failed(
                f"The judge rejected this trace's input: {exc}",
                latency_ms=elapsed_ms(started),
                **accounting.fields(),
            )
        return result

    @abstractmethod
    async def _judge(
        self, clean: dict[str, Any], accounting: _Accounting, started: float
    ) -> ScoreResult:
        """Ask the judge about validated inputs and build the result."""

    def finish(
        self,
        value: float,
        reason: str,
        details: dict[str, Any],
        accounting: _Accounting,
        started: float,
    ) -> ScoreResult:
        """A scored result carrying the accounting and the sampling settings."""
        if self.samples > 1:
            details.setdefault("samples", self.samples)
        return self.scored(
            value, reason, details=details, latency_ms=elapsed_ms(started), **accounting.fields()
        )

    def nothing_retrieved(
        self, accounting: _Accounting, started: float, details: dict[str, Any] | None = None
    ) -> ScoreResult:
        """0.0 without asking the judge about contexts: the spec's rule for an empty retrieval.

        ``details`` keeps what was learnt before (a reference's entities, say).
        """
        return self.scored(
            0.0,
            "Nothing was retrieved, so nothing could be recalled.",
            details={**(details or {}), "retrieved_contexts": 0},
            latency_ms=elapsed_ms(started),
            **accounting.fields(),
        )


def _contexts(clean: dict[str, Any]) -> list[str]:
    return [c for c in clean.get("retrieved_contexts") or [] if c.strip()]


# ---------------------------------------------------------------------------------------------
# 1. llm_context_recall


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
                "claims_with_verdicts",
                prompts.CLAIMS_WITH_VERDICTS,
                user,
                _parse_claims_with_verdicts,
                accounting,
            )
            details: dict[str, Any] = {"claims": claims, "mode": "one_call"}
        else:
            statements, cached = await self.ask_reference(
                "reference_claims",
                prompts.REFERENCE_CLAIMS,
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
                [
                    self.ask("claim_verdicts", prompts.CLAIM_VERDICTS, user, parse, accounting)
                    for _ in range(self.samples)
                ]
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


# ---------------------------------------------------------------------------------------------
# 4. context_entity_recall


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
                "reference_and_context_entities",
                prompts.REFERENCE_AND_CONTEXT_ENTITIES,
                prompts.tagged(reference=reference, context=context_text),
                _parse_both_entities,
                accounting,
            )
            runs = [context_entities]
            details: dict[str, Any] = {"mode": "one_call"}
        else:
            reference_call = self.ask_reference(
                "entities",
                prompts.ENTITIES,
                prompts.tagged(text=reference),
                reference,
                _parse_entities,
                accounting,
            )
            # With nothing retrieved only the reference is asked about: a reference without
            # entities is skipped rather than scored against nothing.
            context_user = prompts.tagged(text=context_text)
            context_calls = [
                self.ask("entities", prompts.ENTITIES, context_user, _parse_entities, accounting)
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


# ---------------------------------------------------------------------------------------------
# 5. chunk_context_recall


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
            [
                self.ask("chunk_recall", prompts.CHUNK_RECALL, user, parse, accounting)
                for _ in range(self.samples)
            ]
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


# ---------------------------------------------------------------------------------------------
# 6. judge_context_recall


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
            [
                self.ask("judge_recall", prompts.JUDGE_RECALL, user, _parse_judge, accounting)
                for _ in range(self.samples)
            ]
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
