"""The public functions re-exported by ``tracer``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from recalltrace.tracer import _threads
from recalltrace.tracer._calls import Spec
from recalltrace.tracer._config import (
    ScrubbingOptions,
    TracerConfig,
    TracerProviderChoice,
    TraceSink,
)
from recalltrace.tracer._conventions import (
    GEN_AI_DATA_SOURCE,
    GEN_AI_OPERATION,
    GEN_AI_REQUEST_MODEL,
    LLM_MODEL_NAME,
    SPAN_KIND,
)
from recalltrace.tracer._decorators import decorate, function_name, locate
from recalltrace.tracer._kinds import GENERATION, RAG, RETRIEVAL
from recalltrace.tracer._metrics import Ledger

logger = logging.getLogger("recalltrace.tracer")

F = TypeVar("F", bound=Callable[..., Any])


def configure(
    config: TracerConfig | None = None,
    *,
    database_url: str | None = None,
    service_name: str | None = None,
    release: str | None = None,
    environment: str | None = None,
    sample_rate: float | None = None,
    sample_rates: Mapping[str, float] | None = None,
    scrubbing: ScrubbingOptions | Literal[False] | None = None,
    max_queue_size: int | None = None,
    max_batch_size: int | None = None,
    flush_interval: float | None = None,
    shutdown_timeout: float | None = None,
    auto_migrate: bool | None = None,
    storage_process: bool | None = None,
    storage_process_nice: int | None = None,
    flush_timeout: float | None = None,
    handle_signals: bool | None = None,
    max_write_attempts: int | None = None,
    retry_backoff: float | None = None,
    reference_wait: float | None = None,
    max_text_length: int | None = None,
    tracer_provider: TracerProviderChoice | Any = None,
    meter_provider: Any = None,
    sink: TraceSink | None = None,
    enabled: bool | None = None,
    capture_spans: bool | None = None,
    genai_span_attributes: bool | None = None,
    drain_on_os_exit: bool | None = None,
    run_dir: str | None = None,
    metrics: Sequence[str] | None = None,
) -> TracerConfig:
    """Configure the tracer for this process and return the configuration in effect.

    Options left as ``None`` come from the environment (``RECALLTRACE_*``, ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SDK_DISABLED``), else the defaults documented on
    :class:`TracerConfig`. Passing ``config`` uses it as is (keyword options then override it).
    Calling ``configure`` again drains the previous writer and replaces it. Without a call,
    the first decorated call configures from the environment.
    """
    # Every keyword is a TracerConfig field of the same name (a test holds them together).
    overrides = {name: value for name, value in locals().items() if name != "config"}
    from recalltrace.tracer import _runtime

    if config is None:
        config = TracerConfig.from_env(**overrides)
    else:
        for name, value in overrides.items():
            if value is not None:
                setattr(config, name, value)
    _runtime.configure(config)
    return config


@overload
def rag(func: F, /) -> F: ...
@overload
def rag(
    positional_name: str | None = None,
    /,
    *,
    name: str | None = None,
    input_param: str | Callable[..., Any] | None = None,
    reference_param: str | None = None,
    reference_contexts_param: str | None = None,
    reference_context_ids_param: str | None = None,
    response_extractor: Callable[[Any], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
) -> Callable[[F], F]: ...
def rag(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    input_param: str | Callable[..., Any] | None = None,
    reference_param: str | None = None,
    reference_contexts_param: str | None = None,
    reference_context_ids_param: str | None = None,
    response_extractor: Callable[[Any], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
) -> Any:
    """Trace the root of a RAG request (an OpenInference ``CHAIN`` span).

    Use bare (``@tracer.rag``) or with options (``@tracer.rag("support-bot", input_param=
    "question")``). The name (default: the function's name) is the app name of the stored
    record and selects per-app sample rates.

    - ``input_param``: the parameter holding the user input, or a callable that takes the
      function's arguments and returns it (``lambda body: body.question`` reads the question of
      a FastAPI request body without storing the whole body); default the first string
      argument.
    - ``reference_param`` / ``reference_contexts_param`` / ``reference_context_ids_param``:
      parameters carrying ground truth known at call time.
    - ``response_extractor``: turns the return value (or each yielded chunk of a generator)
      into the response text; by default a string, an ``answer``/``response``/``output``/...
      key or attribute, else the text of the last generation in the trace.
    - ``metadata``: JSON-serialisable values stored with every record of this app.
    - ``tags``: tags of every record of this app (more per request with
      :func:`set_attributes`).
    """

    def build(fn: Any, name: str | None) -> Any:
        spec = Spec(RAG, name or function_name(fn), {SPAN_KIND: "CHAIN"})
        if callable(input_param):
            spec.input_reader = input_param
        else:
            spec.input = locate(fn, input_param)
        spec.reference = locate(fn, reference_param)
        spec.reference_contexts = locate(fn, reference_contexts_param)
        spec.reference_context_ids = locate(fn, reference_context_ids_param)
        spec.response_extractor = response_extractor
        spec.metadata = dict(metadata) if metadata else None
        spec.tags = [tags] if isinstance(tags, str) else list(tags) if tags else None
        return decorate(fn, spec)

    return _bare_or_configured(func, name, build)


@overload
def retrieval(func: F, /) -> F: ...
@overload
def retrieval(
    positional_name: str | None = None,
    /,
    *,
    name: str | None = None,
    query_param: str | None = None,
    extractor: Callable[[Any], Any] | None = None,
    data_source: str | None = None,
    pool: Callable[..., Any] | None = None,
    pool_share: float = 1.0,
    pool_concurrency: int = 1,
    pool_queue_size: int = 64,
    pool_timeout: float | None = 30.0,
) -> Callable[[F], F]: ...
def retrieval(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    query_param: str | None = None,
    extractor: Callable[[Any], Any] | None = None,
    data_source: str | None = None,
    pool: Callable[..., Any] | None = None,
    pool_share: float = 1.0,
    pool_concurrency: int = 1,
    pool_queue_size: int = 64,
    pool_timeout: float | None = 30.0,
) -> Any:
    """Trace a retriever (an OpenInference ``RETRIEVER`` span) and capture its documents.

    The return value may be a list of strings, dicts (``content``/``text``/``page_content``,
    ``id``/``doc_id``, ``score``, ``metadata``), LangChain-style ``Document`` objects,
    ``(document, score)`` pairs, LlamaIndex-style scored nodes, or an object or dict holding
    such a list (``source_nodes``, ``documents``, ...). A generator may yield documents or
    lists of them. ``extractor`` maps the return value (or each yielded item) to an iterable of
    documents of any of those shapes. ``query_param`` names the query parameter (default: the
    first string argument). ``data_source`` names the index or store searched (the GenAI
    conventions' ``gen_ai.data_source.id`` on the span).

    Besides OpenInference's attributes, the span carries the GenAI conventions' retrieval
    attributes: ``gen_ai.operation.name=retrieval``, ``gen_ai.retrieval.query.text`` and
    ``gen_ai.retrieval.documents`` (a JSON list of ``{id, score}`` for the documents on it).

    ``pool``: a callable taking the retriever's own arguments and returning a deeper or other
    list of documents (same shapes; ``extractor`` applies to it too), which
    ``pooled_context_recall`` scores the retrieval's recall against. It runs for sampled
    requests only, never on the request path: after the retriever returns, its arguments are
    queued for this retriever's own background threads (``pool_concurrency`` of them, default
    1; at most ``pool_queue_size`` calls waiting, default 64, further ones dropped and
    counted), for ``pool_share`` of the sampled requests (default 1.0: all). Its documents are
    scrubbed and stored with the request's record. A pool that raises, or takes longer than
    ``pool_timeout`` seconds (default 30; ``None``: no limit; the call is let finish, its
    documents not stored), is counted and logged once; one that returns nothing is counted
    and stores no pool; none is ever raised. Every outcome is in ``ledger().pool`` (see
    docs/scorers.md).
    """
    if pool is not None:
        from recalltrace.tracer._pool import check_pool_options

        check_pool_options(pool, pool_share, pool_concurrency, pool_queue_size, pool_timeout)

    def build(fn: Any, name: str | None) -> Any:
        attributes: dict[str, Any] = {SPAN_KIND: "RETRIEVER", GEN_AI_OPERATION: "retrieval"}
        if data_source:
            attributes[GEN_AI_DATA_SOURCE] = data_source
        spec = Spec(RETRIEVAL, name or function_name(fn), attributes)
        spec.input = locate(fn, query_param)
        spec.extractor = extractor
        traced = decorate(fn, spec)
        if pool is None:
            return traced
        from recalltrace.tracer._pool import PoolRunner, with_pool

        runner = PoolRunner(
            pool,
            spec.name,
            share=pool_share,
            concurrency=pool_concurrency,
            queue_size=pool_queue_size,
            timeout=pool_timeout,
            extractor=extractor,
        )
        return with_pool(traced, fn, runner)

    return _bare_or_configured(func, name, build)


@overload
def generation(func: F, /) -> F: ...
@overload
def generation(
    positional_name: str | None = None,
    /,
    *,
    name: str | None = None,
    model: str | None = None,
    prompt_param: str | None = None,
) -> Callable[[F], F]: ...
def generation(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    model: str | None = None,
    prompt_param: str | None = None,
) -> Any:
    """Trace a model call (an OpenInference ``LLM`` span) and capture its output.

    The output is read from a string, an OpenAI/LiteLLM-style response (``choices[0].message``),
    an Anthropic-style message (content blocks), a LangChain-style message (``content``), or a
    dict with ``text``/``content``/``output``. A generator's chunks are accumulated (strings,
    ``choices[0].delta.content``, ``delta.text``, message chunks). The model name and token
    usage are taken from the value when it carries them; ``model`` names the requested model.
    ``prompt_param`` names the prompt parameter (default: the first string argument). A
    prompt given as a list of ``{"role", "content"}`` dicts is put on the span as messages
    (OpenInference's ``llm.input_messages``/``llm.output_messages`` and the GenAI conventions'
    ``gen_ai.input.messages``/``gen_ai.output.messages``).
    """

    def build(fn: Any, name: str | None) -> Any:
        attributes: dict[str, Any] = {SPAN_KIND: "LLM", GEN_AI_OPERATION: "chat"}
        if model:
            attributes[LLM_MODEL_NAME] = model
            attributes[GEN_AI_REQUEST_MODEL] = model
        spec = Spec(GENERATION, name or function_name(fn), attributes)
        spec.input = locate(fn, prompt_param)
        return decorate(fn, spec)

    return _bare_or_configured(func, name, build)


def _bare_or_configured(
    func: Any, name: str | None, build: Callable[[Any, str | None], Any]
) -> Any:
    if func is None or isinstance(func, str):
        if isinstance(func, str):
            if name is not None and name != func:
                raise TypeError("the span name was given twice")
            name = func

        def decorator(fn: Any) -> Any:
            return build(fn, name)

        return decorator
    return build(func, name)


def set_reference(
    trace_id: str | int | None,
    *,
    reference: str | None = None,
    reference_contexts: list[str] | None = None,
    reference_context_ids: list[str] | None = None,
) -> None:
    """Attach ground truth to a trace, now or later.

    ``trace_id`` is the 32-hex-digit id from :func:`current_trace_id` (or an int; ``None``
    means the request of the current context). While the trace is still in memory the values
    are merged into its record; once stored, they are attached by the writer thread, which
    retries for ``reference_wait`` seconds if the trace is still on its way to storage.
    Never raises for storage problems, nor when the configuration the environment gives is
    refused (like the decorators: the refusal is logged once, and each reference so ignored
    is counted in ``references_ignored``); raises ``ValueError`` for a malformed id.
    """
    from recalltrace.tracer import _runtime

    if _runtime.current is None:
        try:
            _runtime.get()
        except ValueError:
            _ignore_reference()
            return
    _runtime.set_reference(
        trace_id,
        reference=reference,
        reference_contexts=reference_contexts,
        reference_context_ids=reference_context_ids,
    )


references_ignored = 0
"""References :func:`set_reference` ignored because the tracer's configuration was refused."""
_ignored_lock = _threads.Lock()


def _ignore_reference() -> None:
    global references_ignored
    with _ignored_lock:
        references_ignored += 1
        first = references_ignored == 1
    if first:
        logger.error(
            "recalltrace: set_reference() ignores references while the configuration is "
            "refused (said above); they are counted in recalltrace.tracer._api.references_ignored"
        )


def set_attributes(
    *,
    user_id: str | int | None = None,
    session_id: str | int | None = None,
    tags: str | Sequence[str] | None = None,
    release: str | None = None,
    environment: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> bool:
    """Set attributes of the request being traced in the current context, to filter and group
    its scores by later (``recalltrace scores compare --by user_id``, ``--where tag=beta``).

    ``user_id`` and ``session_id`` name the end user and the conversation; ``tags`` adds one
    tag or several; ``release`` and ``environment`` override the process's (``configure``'s
    ``release``/``environment``, else ``service.version`` and ``deployment.environment.name``
    of the OpenTelemetry resource) for this request; ``metadata`` adds JSON-serialisable
    values to the record's metadata. Values are scrubbed like every other field: an e-mail
    address used as a user id is stored redacted, so prefer opaque ids.

    Returns ``False`` (and says so once in the log) when no request is open; never raises.
    """
    from recalltrace.tracer import _runtime

    try:
        return _runtime.set_attributes(
            user_id=user_id,
            session_id=session_id,
            tags=tags,
            release=release,
            environment=environment,
            metadata=metadata,
        )
    except Exception:
        from recalltrace.tracer._internal import user_code_error

        user_code_error("set_attributes()")
        return False


def current_trace_id() -> str | None:
    """The id of the request being traced in the current context (32 lowercase hex digits),
    or ``None`` outside a decorated request.

    It is the id the request's record is stored under, for :func:`set_reference` and
    ``recalltrace trace show``. It is not the OpenTelemetry trace id: one OpenTelemetry trace
    may hold several requests, each its own record (the record keeps the trace and span ids).
    """
    from recalltrace.tracer import _runtime

    return _runtime.current_trace_id()


def flush(timeout: float | None = None) -> bool:
    """Block until every record queued so far is stored or dropped. Returns ``False`` when
    ``timeout`` seconds (default: the ``flush_timeout`` option, 30 s) passed first, e.g. while
    storage is down, and then logs how many records still wait. Never waits forever."""
    from recalltrace.tracer import _runtime

    return _runtime.flush(timeout)


def shutdown(timeout: float | None = None) -> bool:
    """Drain the queue (up to ``timeout``, default ``shutdown_timeout``) and stop the writer.
    Records still unstored are dropped and counted. Called automatically at exit."""
    from recalltrace.tracer import _runtime

    return _runtime.shutdown(timeout)


def ledger() -> Ledger:
    """Every request this process's tracer saw and where it ended: ``seen``, ``stored`` (the
    storage confirmed the write), ``sampled_out``, ``dropped`` by reason, and ``pending``
    (queued or held by the writer). When the writer is idle (after ``flush()``),
    ``seen == stored + sampled_out + dropped_total + pending``; ``unaccounted`` is the
    difference. ``values_not_read`` counts application objects left out of stored records."""
    from recalltrace.tracer import _runtime

    return _runtime.ledger()
