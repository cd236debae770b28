"""The judge client: one model behind LiteLLM, with limits, retries and accounting.

LiteLLM is imported on the first call, not when this module is imported, because importing it
takes seconds. Importing this module sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (unless the user
set it) so LiteLLM reads its bundled price list instead of fetching one from the internet.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gc
import logging
import os
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypeVar

from recalltrace.scorers._cache import current_judge_scope
from recalltrace.scorers._errors import (
    JudgeError,
    TerminalJudgeError,
    TransientJudgeError,
    nothing_answered,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
# ``asyncio.timeout`` exists from Python 3.11 on; 3.10 falls back to ``asyncio.wait_for``.
_TIMEOUT: Callable[[float], Any] | None = getattr(asyncio, "timeout", None)

# LiteLLM fetches its price list from the internet at import unless told to use its bundled
# copy. Set the flag now (unless the user chose), so it holds whoever imports LiteLLM first.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

OutputMode = Literal["auto", "json_schema", "json_object"]

_litellm: Any = None


JUDGE_EXTRA_HINT = (
    "the LLM judge needs LiteLLM, which is not installed: install recalltrace with its judge "
    "extra, `pip install '.[judge]'` in a checkout or `pip install "
    "'dist/recalltrace-{version}-py3-none-any.whl[judge]'` for a wheel built with "
    "`python -m build` (or `pip install litellm` beside it)"
)


def judge_extra_hint() -> str:
    """:data:`JUDGE_EXTRA_HINT` with the installed version in the wheel's name."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("recalltrace")
    except PackageNotFoundError:
        installed = "VERSION"
    return JUDGE_EXTRA_HINT.format(version=installed)


class JudgeBackendMissing(ImportError):
    """LiteLLM is not installed: the judge lives in the ``recalltrace[judge]`` extra."""


def require_judge_backend() -> None:
    """Raise :class:`JudgeBackendMissing` (one line naming the extra) unless LiteLLM can be
    imported. Cheap: it only looks the package up."""
    import importlib.util

    if _litellm is None and importlib.util.find_spec("litellm") is None:
        raise JudgeBackendMissing(judge_extra_hint())


def _load_litellm() -> Any:
    """Import LiteLLM once, offline and quiet."""
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm
        except ImportError as exc:
            if exc.name != "litellm":
                raise
            raise JudgeBackendMissing(judge_extra_hint()) from None

        litellm.suppress_debug_info = True
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
            lite_logger = logging.getLogger(name)
            if lite_logger.level == logging.NOTSET:
                lite_logger.setLevel(logging.ERROR)
        _litellm = litellm
    return _litellm


LITELLM_HTTP_FLAG = "EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER"
"""LiteLLM's environment switch that sends OpenAI and OpenAI-compatible chat requests through
its own HTTP handler instead of the OpenAI SDK."""


def load_judge_backend(*, freeze_gc: bool = False, litellm_http: bool = False) -> None:
    """Import LiteLLM now instead of on the first judge call.

    The import takes seconds; done lazily inside a running event loop it stalls every task on
    that loop for as long. Call this at start-up in a service that will judge.

    ``litellm_http=True`` sends chat requests to OpenAI and OpenAI-compatible servers through
    LiteLLM's own HTTP handler instead of the OpenAI SDK (LiteLLM's
    ``EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER`` switch). The request on the wire is the same
    JSON body to the same endpoint; skipping the SDK's request transform saves about a third
    of LiteLLM's CPU per call. The switch is an environment variable LiteLLM reads on every
    call, so it holds for the whole process; a value already in the environment wins, so
    ``EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER=false`` keeps the SDK whatever this is told.

    ``freeze_gc=True`` then moves every object alive at that moment out of the garbage
    collector's generations (:func:`gc.freeze`). LiteLLM keeps a large heap of long-lived
    module state (its price list, provider tables, pydantic models) that every full collection
    otherwise walks again; frozen, it costs nothing per call. Measured here, the CPU per judge
    call falls by about a quarter. Frozen objects are still freed by reference counting; only
    reference cycles among them are never collected, which is why this is opt-in: use it in a
    process dedicated to scoring (``recalltrace worker`` does), after its imports and set-up.
    """
    if litellm_http:
        os.environ.setdefault(LITELLM_HTTP_FLAG, "true")
    _load_litellm()
    if freeze_gc:
        gc.collect()
        gc.freeze()


@dataclass(frozen=True)
class JudgeConfig:
    """Which model judges, and how it is called. Every field has a production-safe default."""

    model: str
    """LiteLLM model name with its provider prefix, e.g. ``"openai/gpt-4o-mini"``."""
    api_base: str | None = None
    """Base URL of an OpenAI-compatible server (vLLM, Ollama, a proxy); ``None`` for the default."""
    api_key: str | None = None
    """API key; ``None`` lets LiteLLM read the provider's usual environment variable."""
    provider: str | None = None
    """LiteLLM ``custom_llm_provider``, when the model name has no provider prefix."""
    temperature: float = 0.0
    """Sampling temperature; 0 for the most repeatable verdicts."""
    seed: int | None = 0
    """Sampling seed, sent where the provider takes one (dropped silently elsewhere)."""
    output_mode: OutputMode = "auto"
    """``"json_schema"`` (structured output), ``"json_object"`` (JSON mode, then validation) or
    ``"auto"``: a schema when LiteLLM knows the model supports one, JSON mode otherwise."""
    max_tokens: int | None = 2048
    """Cap on completion tokens per call."""
    timeout_s: float = 60.0
    """Wall-time limit of one HTTP attempt, body included."""
    max_concurrency: int = 16
    """Most calls in flight at once through this client."""
    requests_per_minute: float | None = None
    """Optional request rate limit for this model."""
    tokens_per_minute: float | None = None
    """Optional token rate limit (prompt plus completion, estimated before the call)."""
    max_retries: int = 5
    """Retries of transient errors (429, 408, 409, 5xx, timeouts, connection errors) per call."""
    max_retry_wait_s: float = 120.0
    """Total seconds one call may spend waiting between retries before giving up."""
    backoff_initial_s: float = 1.0
    """First backoff delay; doubled after every failure, with full jitter."""
    backoff_max_s: float = 30.0
    """Cap of one backoff delay (a ``Retry-After`` the server sends is honoured as given)."""
    extra_params: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments passed to ``litellm.acompletion`` unchanged."""

    def __post_init__(self) -> None:
        if not self.model or not isinstance(self.model, str):
            raise ValueError("a judge model is needed, e.g. model='openai/gpt-4o-mini'")
        if self.output_mode not in ("auto", "json_schema", "json_object"):
            raise ValueError(f"unknown output_mode {self.output_mode!r}")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.max_retries < 0 or self.max_retry_wait_s < 0:
            raise ValueError("max_retries and max_retry_wait_s must not be negative")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None")


#: Names of :class:`JudgeConfig` fields, for splitting keyword options.
CONFIG_FIELDS: frozenset[str] = frozenset(f.name for f in fields(JudgeConfig))


@dataclass(frozen=True)
class JudgeCallRecord:
    """One HTTP attempt to the judge, successful or not (for metrics)."""

    model: str
    provider: str | None
    operation: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_s: float
    error_type: str | None = None
    """``None`` on success, else the error's class name (``RateLimitError``, ``Timeout``...)."""
    status_code: int | None = None
    possibly_billed_tokens: float = 0.0
    """Estimated tokens of a failed call that may still be billed: the request was sent and no
    answer came back in time (a timeout), so the provider may have run it; 0 otherwise."""


def may_be_billed(exc: BaseException) -> bool:
    """Whether a failed call may still be billed: it timed out (the model may have run it), as
    opposed to an error status the provider answered (not billed) or no connection at all."""
    if nothing_answered(exc):
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (
            isinstance(current, (asyncio.TimeoutError, TimeoutError))
            or "Timeout" in type(current).__name__
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class JudgeReply:
    """A successful completion: its text and what it cost."""

    content: str
    finish_reason: str | None
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_s: float
    attempts: int
    replayed: bool = False
    """Read back from the job's stored answers (no call made); its tokens and cost are those
    of the call that paid for it (0 if it was stored by another scope)."""

    def stored(self) -> dict[str, Any]:
        """What is kept of this answer for a job taken again after a crash."""
        return {
            "content": self.content,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
        }

    @classmethod
    def replay(cls, model: str, paid_here: bool, answer: dict[str, Any]) -> JudgeReply | None:
        """The reply a stored answer stands for (``None`` when it is not one)."""
        content = answer.get("content")
        if not isinstance(content, str):
            return None
        cost = answer.get("cost_usd")
        return cls(
            content=content,
            finish_reason=answer.get("finish_reason"),
            model=model,
            prompt_tokens=token_count(answer.get("prompt_tokens")) if paid_here else 0,
            completion_tokens=token_count(answer.get("completion_tokens")) if paid_here else 0,
            cost_usd=(float(cost) if isinstance(cost, (int, float)) else None)
            if paid_here
            else 0.0,
            latency_s=0.0,
            attempts=0,
            replayed=True,
        )


class JudgeInputRejected(JudgeError):
    """The provider refused this particular input (context window, content policy).

    Other traces may still be judged, so scorers turn it into a ``failed`` result.
    """


_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
_TERMINAL_NAMES = frozenset(
    {
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        "BudgetExceededError",
        "PaymentRequiredError",
        "UnsupportedParamsError",
        "BadRequestError",
        "UnprocessableEntityError",
        "InvalidRequestError",
        "ModelNotMappedError",
    }
)
_TRANSIENT_NAMES = frozenset(
    {
        "RateLimitError",
        "Timeout",
        "APITimeoutError",
        "APIConnectionError",
        "InternalServerError",
        "ServiceUnavailableError",
        "BadGatewayError",
        "RouterRateLimitError",
    }
)
_REJECTED_NAMES = frozenset({"ContextWindowExceededError", "ContentPolicyViolationError"})


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def classify_error(exc: BaseException) -> Literal["transient", "terminal", "rejected"]:
    """Sort an exception from a judge call into transient, terminal or rejected-input."""
    names = _class_names(exc)
    if names & _REJECTED_NAMES:
        return "rejected"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError, OSError)):
        return "transient"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        if status in _TRANSIENT_STATUS or status >= 500:
            return "transient"
        if 400 <= status < 500:
            return "terminal"
    if names & _TERMINAL_NAMES:
        return "terminal"
    if names & _TRANSIENT_NAMES:
        return "transient"
    # Unknown failures inside the client library: retrying is the safer guess, and the retry
    # budget bounds the cost of being wrong.
    return "transient"


def retry_after_seconds(exc: BaseException, now: Callable[[], float] = time.time) -> float | None:
    """The server's ``Retry-After`` (or ``retry-after-ms``) hint in seconds, if it sent one.

    An HTTP date is read against ``now`` (the wall clock, seconds since the epoch).
    """
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            return max(0.0, float(millis) / 1000.0)
        value = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


class _Bucket:
    """A token bucket refilled continuously at ``rate_per_minute``."""

    def __init__(self, rate_per_minute: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.rate = rate_per_minute / 60.0
        # A burst of up to ten seconds' worth, at least one request's worth.
        self.capacity = max(1.0, rate_per_minute / 6.0)
        self.level = self.capacity
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_time(self, amount: float) -> float:
        """Seconds until ``amount`` can be taken (0 when it can be taken now)."""
        self._refill()
        amount = min(amount, self.capacity)
        if self.level >= amount:
            return 0.0
        return (amount - self.level) / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= min(amount, self.capacity)

    def give_back(self, amount: float) -> None:
        self._refill()
        self.level = min(self.capacity, self.level + amount)


class _Limits:
    """Concurrency, rate limits and a shared pause after ``Retry-After``, for one event loop."""

    def __init__(
        self,
        config: JudgeConfig,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.semaphore = asyncio.Semaphore(config.max_concurrency)
        rpm, tpm = config.requests_per_minute, config.tokens_per_minute
        self.requests = _Bucket(rpm, clock) if rpm else None
        self.tokens = _Bucket(tpm, clock) if tpm else None
        self.paused_until = 0.0
        self.lock = asyncio.Lock()

    async def acquire(self, estimated_tokens: float) -> None:
        await self.semaphore.acquire()
        try:
            async with self.lock:  # one waiter at a time keeps the buckets fair
                while True:
                    waits = [self.paused_until - self.clock()]
                    if self.requests is not None:
                        waits.append(self.requests.wait_time(1))
                    if self.tokens is not None:
                        waits.append(self.tokens.wait_time(estimated_tokens))
                    wait = max(waits)
                    if wait <= 0:
                        break
                    await self.sleep(wait)
                if self.requests is not None:
                    self.requests.take(1)
                if self.tokens is not None:
                    self.tokens.take(estimated_tokens)
        except BaseException:
            self.semaphore.release()
            raise

    def release(self, estimated_tokens: float, used_tokens: float | None) -> None:
        if self.tokens is not None and used_tokens is not None:
            if used_tokens < estimated_tokens:
                self.tokens.give_back(estimated_tokens - used_tokens)
            else:
                self.tokens.take(used_tokens - estimated_tokens)
        self.semaphore.release()

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, self.clock() + seconds)


class JudgeClient:
    """Calls one judge model through ``litellm.acompletion``.

    Shared by the LLM variants (share one client per model so the limits apply to all of them).
    Every HTTP attempt is reported to ``on_call``; transient errors are retried with exponential
    backoff and jitter (``Retry-After`` honoured, and it pauses every call to the model);
    errors that outlast the retry budget raise :class:`TransientJudgeError`, configuration
    errors raise :class:`TerminalJudgeError` at once.
    """

    def __init__(
        self,
        config: JudgeConfig | None = None,
        *,
        on_call: Callable[[JudgeCallRecord], None] | None = None,
        **options: Any,
    ) -> None:
        """Create a client from a :class:`JudgeConfig` or from its fields as keywords."""
        if config is None:
            config = JudgeConfig(**options)
        elif options:
            config = replace(config, **options)
        self.config = config
        self.on_call = on_call
        self._limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Limits] = (
            weakref.WeakKeyDictionary()
        )
        self._schema_support: bool | None = None
        self._random = random.Random()
        self.oversized_answers = 0
        """Answers longer than :data:`MAX_ANSWER_CHARS`, cut before parsing."""
        self.clock: Callable[[], float] = time.monotonic
        """The monotonic clock (seconds) the rate limits and the pause after ``Retry-After``
        are measured on; set it before the first call (a test drives a clock by hand)."""
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        """How the client waits: before a retry, for a rate limit or a pause. A test that
        drives :attr:`clock` by hand waits on it instead."""

    def __repr__(self) -> str:
        return f"JudgeClient(model={self.config.model!r})"

    @property
    def model(self) -> str:
        """The judge model name."""
        return self.config.model

    @property
    def provider(self) -> str | None:
        """The provider, from the configuration or the model name's prefix."""
        if self.config.provider:
            return self.config.provider
        prefix, sep, _ = self.config.model.partition("/")
        return prefix if sep else None

    def _loop_limits(self) -> _Limits:
        # asyncio primitives belong to one loop; the synchronous ``score()`` runs a fresh loop
        # per call, so limits are kept per loop.
        loop = asyncio.get_running_loop()
        limits = self._limits.get(loop)
        if limits is None:
            limits = self._limits[loop] = _Limits(self.config, self.clock, self.sleep)
        return limits

    def uses_schema(self) -> bool:
        """True when answers are requested as structured output with a JSON schema."""
        mode = self.config.output_mode
        if mode != "auto":
            return mode == "json_schema"
        if self._schema_support is None:
            litellm = _load_litellm()
            try:
                self._schema_support = bool(
                    litellm.supports_response_schema(
                        model=self.config.model, custom_llm_provider=self.config.provider
                    )
                )
            except Exception:
                self._schema_support = False
        return self._schema_support

    def request_params(
        self, messages: Sequence[dict[str, Any]], schema_name: str, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """The keyword arguments of ``litellm.acompletion`` for one judge request."""
        config = self.config
        if self.uses_schema():
            response_format: dict[str, Any] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": True},
            }
        else:
            response_format = {"type": "json_object"}
        params: dict[str, Any] = {
            "model": config.model,
            "messages": list(messages),
            "temperature": config.temperature,
            "response_format": response_format,
            "timeout": config.timeout_s,
            # Retries are ours (they honour Retry-After and share a pause across calls).
            "max_retries": 0,
            "num_retries": 0,
            "drop_params": True,
        }
        if config.seed is not None:
            params["seed"] = config.seed
        if config.max_tokens is not None:
            params["max_tokens"] = config.max_tokens
        if config.api_base is not None:
            params["api_base"] = config.api_base
        if config.api_key is not None:
            params["api_key"] = config.api_key
        if config.provider is not None:
            params["custom_llm_provider"] = config.provider
        params.update(config.extra_params)
        return params

    def _backoff(self, failures: int) -> float:
        ceiling = min(
            self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (failures - 1)
        )
        return self._random.uniform(0.0, ceiling)

    def _report(self, record: JudgeCallRecord) -> None:
        if self.on_call is None:
            return
        try:
            self.on_call(record)
        except Exception:  # a metrics hook must never break scoring
            logger.exception("the judge's on_call hook raised")

    def estimate_cost(self, prompt_tokens: float) -> float | None:
        """US dollars of ``prompt_tokens`` sent to this model at LiteLLM's price, ``None`` when
        the price list has no price for it."""
        try:
            prompt_usd, _completion_usd = _load_litellm().cost_per_token(
                model=self.model, prompt_tokens=int(prompt_tokens), completion_tokens=0
            )
        except Exception:
            return None
        return float(prompt_usd)

    def _cost(self, litellm: Any, response: Any) -> float | None:
        hidden = getattr(response, "_hidden_params", None) or {}
        if "response_cost" in hidden:
            # LiteLLM priced the response already (None when the model has no price).
            cost = hidden["response_cost"]
            return None if cost is None else float(cost)
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:
            return None
        # LiteLLM raises for a model missing from its price list; a listed free model costs 0.
        return None if cost is None else float(cost)

    async def chat(
        self, messages: Sequence[dict[str, Any]], *, schema_name: str, schema: dict[str, Any]
    ) -> JudgeReply:
        """Send one judge request and return the answer text with its accounting.

        Raises:
            TransientJudgeError: transient failures outlasted ``max_retries`` or
                ``max_retry_wait_s``.
            TerminalJudgeError: authentication, permission, unknown model, budget or a request
                the provider rejects because of the configuration.
            JudgeInputRejected: the provider refused this input (context window, policy).
        """
        litellm = _load_litellm()
        params = self.request_params(messages, schema_name, schema)
        # A job taken again after its worker died reads the answers it already paid for.
        kept, key = current_judge_scope(), ""
        if kept is not None:
            key = kept.key_for(params)
            recalled = await kept.recall(key)
            replayed = None if recalled is None else JudgeReply.replay(self.model, *recalled)
            if replayed is not None:
                return replayed
        limits = self._loop_limits()
        # About four characters a token for the prompt, and a typical verdict's length for the
        # answer (the cap would be too pessimistic); corrected with the reported usage after.
        estimated = sum(len(str(m.get("content", ""))) for m in messages) / 4.0 + min(
            self.config.max_tokens or 512, 512
        )
        failures = 0
        waited = 0.0
        started = time.perf_counter()
        while True:
            await limits.acquire(estimated)
            attempt_started = time.perf_counter()
            used: float | None = None
            try:
                response = await _within(litellm.acompletion(**params), self.config.timeout_s)
            except asyncio.CancelledError:
                limits.release(estimated, 0.0)  # a cancelled call gives its slot back
                raise
            except Exception as exc:
                latency = time.perf_counter() - attempt_started
                status = getattr(exc, "status_code", None)
                status = status if isinstance(status, int) else None
                self._report(
                    JudgeCallRecord(
                        model=self.model,
                        provider=self.provider,
                        operation="chat",
                        prompt_tokens=None,
                        completion_tokens=None,
                        cost_usd=None,
                        latency_s=latency,
                        error_type=type(exc).__name__,
                        status_code=status,
                        possibly_billed_tokens=estimated if may_be_billed(exc) else 0.0,
                    )
                )
                limits.release(estimated, 0.0)
                kind = classify_error(exc)
                message = f"{type(exc).__name__}: {str(exc)[:300]}"
                if kind == "terminal":
                    raise TerminalJudgeError(
                        f"the judge {self.model} refused the request ({message})",
                        model=self.model,
                        status_code=status,
                        error_type=type(exc).__name__,
                    ) from exc
                if kind == "rejected":
                    raise JudgeInputRejected(
                        f"the judge {self.model} rejected this input ({message})",
                        model=self.model,
                        status_code=status,
                        error_type=type(exc).__name__,
                    ) from exc
                failures += 1
                hint = retry_after_seconds(exc)
                delay = hint if hint is not None else self._backoff(failures)
                if hint is not None:
                    limits.pause(hint)
                if (
                    failures > self.config.max_retries
                    or waited + delay > self.config.max_retry_wait_s
                ):
                    unreachable = nothing_answered(exc)
                    raise TransientJudgeError(
                        f"the judge {self.model} still failed after {failures} attempt(s) "
                        f"({'nothing answered: ' if unreachable else ''}{message})",
                        model=self.model,
                        status_code=status if status is not None else _timeout_status(exc),
                        error_type=type(exc).__name__,
                        retry_after_s=hint,
                        attempts=failures,
                        unreachable=unreachable,
                    ) from exc
                logger.debug("judge call failed (%s); retrying in %.2fs", message, delay)
                await self.sleep(delay)
                waited += delay
                continue
            latency = time.perf_counter() - attempt_started
            usage = getattr(response, "usage", None)
            # Counts the server reports are checked: a negative, fractional, absurd or
            # non-numeric count is unknown, never a reason to fail a valid answer.
            prompt_tokens = token_count(getattr(usage, "prompt_tokens", None))
            completion_tokens = token_count(getattr(usage, "completion_tokens", None))
            if prompt_tokens is not None and completion_tokens is not None:
                used = float(prompt_tokens + completion_tokens)
            limits.release(estimated, used)
            cost = self._cost(litellm, response)
            hidden = getattr(response, "_hidden_params", None) or {}
            provider = hidden.get("custom_llm_provider") or self.provider
            self._report(
                JudgeCallRecord(
                    model=self.model,
                    provider=provider,
                    operation="chat",
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    cost_usd=cost,
                    latency_s=latency,
                )
            )
            choice = response.choices[0]
            content = getattr(choice.message, "content", None) or ""
            if not isinstance(content, str):
                content = str(content)
            if len(content) > MAX_ANSWER_CHARS:
                # Cut before anything parses or keeps it: the scorer sees an answer too long to
                # be valid, and a 10 MB reason is never stored.
                self.oversized_answers += 1
                content = content[:MAX_ANSWER_CHARS] + OVERSIZED_MARK
            reply = JudgeReply(
                content=content,
                finish_reason=getattr(choice, "finish_reason", None),
                model=self.model,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost,
                latency_s=time.perf_counter() - started,
                attempts=failures + 1,
            )
            if kept is not None:
                await kept.remember(key, reply.stored())  # kept before anyone uses it
            return reply


MAX_ANSWER_CHARS = 256 * 1024
"""Longest judge answer read; a longer one is cut here and fails validation as too long."""
OVERSIZED_MARK = "\n[recalltrace: answer cut at 262144 characters]"
MAX_TOKEN_COUNT = 100_000_000
"""Largest token count of one call believed; beyond it (or below 0) the count is unknown."""


def token_count(value: Any) -> int | None:
    """A reported token count if it is a plausible whole number, else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        return None
    return value


async def _within(call: Awaitable[T], seconds: float) -> T:
    """Await ``call`` with a deadline, in the caller's own task where the loop allows it.

    ``asyncio.wait_for`` runs the call as a task of its own on Python 3.10 and 3.11, which adds
    three trips through the event loop's queue per call; under load each trip waits behind
    everything else that is ready (benchmarks/README.md has the figures). ``asyncio.timeout``
    (3.11+) cancels the caller's task instead.
    """
    if _TIMEOUT is None:
        return await asyncio.wait_for(call, timeout=seconds)
    async with _TIMEOUT(seconds):
        return await call


def _timeout_status(exc: BaseException) -> int | None:
    return 408 if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else None
