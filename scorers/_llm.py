"""What the variants that ask a judge model share: asking, re-asking, parsing and accounting.

Each answer is parsed and validated before it is scored. An invalid answer (not JSON, cut off,
wrong shape, out-of-range score, wrong chunk ids, no claims) is asked again once with the
problem stated; if the second answer is invalid too, the result is ``failed`` with the reason.
Judge transport errors are not turned into results: they raise ``TransientJudgeError`` or
``TerminalJudgeError`` for the caller to reschedule or pause.
"""

from __future__ import annotations

import asyncio
import json
import re
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from recalltrace.scorers import _prompts as prompts
from recalltrace.scorers._base import BaseScorer, elapsed_ms
from recalltrace.scorers._cache import DEFAULT_CACHE, ReferenceCache, cache_key
from recalltrace.scorers._judge import (
    MAX_ANSWER_CHARS,
    OVERSIZED_MARK,
    JudgeClient,
    JudgeInputRejected,
    JudgeReply,
)
from recalltrace.scorers._prompts import JudgeTask
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


def _no_constant(name: str) -> Any:
    raise InvalidAnswer(f"The answer holds {name}, which is not a JSON number.")


def parse_json_object(content: str, finish_reason: str | None = None) -> dict[str, Any]:
    """Parse a judge answer into a JSON object, tolerating a code fence or text around it.

    Answers cut by the client for their size, and ``NaN``/``Infinity`` (which Python's JSON
    reader would otherwise accept), are invalid.
    """
    if content.endswith(OVERSIZED_MARK):
        raise InvalidAnswer(
            f"The answer was longer than {MAX_ANSWER_CHARS:,} characters; answer briefly."
        )
    if finish_reason == "length":
        raise InvalidAnswer("The answer was cut off at the token limit before the JSON ended.")
    text = content.strip()
    if not text:
        raise InvalidAnswer("The answer was empty.")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise InvalidAnswer("The answer was not JSON.") from None
        try:
            data = json.loads(text[start : end + 1], parse_constant=_no_constant)
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
    """A 0/1 or true/false verdict. Other numbers (2, -1, infinities) are invalid: a judge that
    answers them did not follow the schema, and counting them as 1 would inflate recall."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
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


MAX_TEXT_CHARS = 2000
"""Longest statement or reason kept from a judge answer; longer ones are cut (and marked)."""


def _text(value: Any, what: str, *, allow_empty: bool = True) -> str:
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise InvalidAnswer(f"{what} must be a non-empty string.")
    text = value.strip()
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f" … (cut, {len(text) - MAX_TEXT_CHARS} more characters)"
    return text


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
        task: JudgeTask,
        user: str,
        parse: Callable[[dict[str, Any]], T],
        accounting: _Accounting,
    ) -> T:
        """Ask the judge ``task`` about ``user``, validate with ``parse``; on an invalid answer
        ask once more. Raises ``InvalidAnswer`` when both answers are invalid.
        """
        messages = prompts.messages(task.system, user)
        problem: InvalidAnswer | None = None
        for attempt in range(2):
            reply = await self.judge.chat(messages, schema_name=task.name, schema=task.schema)
            accounting.add(reply)
            try:
                example = prompts.example_of(task)
                if example and example in reply.content:
                    # A judge that echoes the instructions must not be scored on their example.
                    raise InvalidAnswer("The answer repeats the instructions' example.")
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
        task: JudgeTask,
        user: str,
        text: str,
        parse: Callable[[dict[str, Any]], T],
        accounting: _Accounting,
    ) -> tuple[T, bool]:
        """Like :meth:`ask` for work that depends only on ``text``: served from the cache."""

        async def compute() -> T:
            return await self.ask(task, user, parse, accounting)

        if self.cache is None:
            return await compute(), False
        key = cache_key(task.name, self.judge.model, prompts.PROMPT_VERSION, text)
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
