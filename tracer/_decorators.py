"""``@rag``, ``@retrieval`` and ``@generation``: real OpenTelemetry spans plus trace capture.

At decoration time the function is inspected once: its kind (plain, coroutine, generator, async
generator) picks the wrapper, and the positions of the parameters to capture are resolved. Per
call, the wrapper opens a span in the current context, stores what the trace record needs as raw
values on the trace state, and leaves conversion, scrubbing and storage to the writer thread.

Generators keep their span open across yields but make it current only while their own code
runs, so the caller's context is never left pointing at the generator's span.

OpenTelemetry is imported on the first call, not at ``import tracer``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from os import urandom
from typing import Any, NamedTuple, TypeVar

from recalltrace.tracer._extract import (
    Doc,
    Usage,
    document_list,
    flat_json,
    is_plain_data,
    metadata_json,
    quote_json,
    read_answer,
    read_chunk_text,
    read_document,
    read_generation_text,
    read_model,
    read_usage,
    snapshot,
    to_text,
    unreadable,
)
from recalltrace.tracer._internal import (
    FORK_IDS,
    at_fork_in_child,
    internal_error,
    user_code_error,
)
from recalltrace.tracer._scrub import scrub_span_attributes

F = TypeVar("F", bound=Callable[..., Any])

RAG, RETRIEVAL, GENERATION = 0, 1, 2

SPAN_KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
LLM_MODEL_NAME = "llm.model_name"
LLM_PROMPT_TOKENS = "llm.token_count.prompt"
LLM_COMPLETION_TOKENS = "llm.token_count.completion"
LLM_TOTAL_TOKENS = "llm.token_count.total"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_QUERY_TEXT = "gen_ai.retrieval.query.text"
GEN_AI_DOCUMENTS = "gen_ai.retrieval.documents"
GEN_AI_DATA_SOURCE = "gen_ai.data_source.id"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
# At most this many messages of a chat prompt are put on a generation span, flattened as
# OpenInference's llm.input_messages.N.message.{role,content} and in gen_ai.input.messages
# (input.value keeps the whole prompt).
MAX_SPAN_MESSAGES = 32
_FIRST_MESSAGE_ROLE = "llm.input_messages.0.message.role"
DOCUMENTS_TOTAL = "recalltrace.retrieval.documents"
DOCUMENTS_ON_SPAN = "recalltrace.retrieval.documents_on_span"

# Attributes kept free on a retrieval span for what is set after the documents (an output, the
# two counts above, an error status's exception attributes).
_ATTRIBUTE_RESERVE = 8
# Set with the documents besides their own attributes: the two counts and the GenAI list.
_WITH_DOCUMENTS = 3

_DOC_KEY_CACHE = 256


def _doc_keys(index: int) -> tuple[str, str, str, str]:
    prefix = f"retrieval.documents.{index}.document."
    return (prefix + "id", prefix + "content", prefix + "score", prefix + "metadata")


_DOC_KEYS = [_doc_keys(i) for i in range(_DOC_KEY_CACHE)]


class _Param(NamedTuple):
    """Where to find one argument: by keyword ``name``, else ``position``, else
    ``default`` (``missing`` when the parameter has no default)."""

    name: str
    position: int | None
    default: Any
    missing: bool


_MISSING = object()


def _locate(signature: inspect.Signature | None, name: str | None, fn: Any) -> _Param | None:
    if name is None:
        return None
    if signature is None:
        return _Param(name, None, None, True)
    index: int | None = None
    default: Any = None
    missing = True
    for position, parameter in enumerate(signature.parameters.values()):
        if parameter.name != name:
            continue
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            index = position
        if parameter.default is not parameter.empty:
            default = parameter.default
            missing = False
        break
    else:
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        if not takes_kwargs:
            raise TypeError(f"{fn.__qualname__} has no parameter named {name!r}")
    return _Param(name, index, default, missing)


def _argument(param: _Param, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if param.name in kwargs:
        return kwargs[param.name]
    if param.position is not None and param.position < len(args):
        return args[param.position]
    return None if param.missing else param.default


def _read_input(spec: _Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The request's input as the ``input_param`` callable reads it from the arguments."""
    assert spec.input_reader is not None
    try:
        return spec.input_reader(*args, **kwargs)
    except Exception:
        user_code_error(f"the input_param callable of {spec.qualname}")
        return None


def _first_string(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    for value in args:
        if isinstance(value, str):
            return value
    for value in kwargs.values():
        if isinstance(value, str):
            return value
    return None


class _Spec:
    """Everything decided at decoration time."""

    __slots__ = (
        "attributes",
        "extractor",
        "input",
        "input_reader",
        "kind",
        "metadata",
        "name",
        "qualname",
        "reference",
        "reference_context_ids",
        "reference_contexts",
        "response_extractor",
        "tags",
    )

    def __init__(self, kind: int, name: str, attributes: dict[str, Any]) -> None:
        self.kind = kind
        self.name = name
        self.qualname = name
        self.attributes = attributes
        self.input: _Param | None = None
        self.reference: _Param | None = None
        self.reference_contexts: _Param | None = None
        self.reference_context_ids: _Param | None = None
        self.extractor: Callable[[Any], Any] | None = None
        self.response_extractor: Callable[[Any], Any] | None = None
        self.metadata: dict[str, Any] | None = None
        self.input_reader: Callable[..., Any] | None = None
        self.tags: list[str] | None = None


class _Call:
    """One open decorated call."""

    __slots__ = (
        "chat",
        "ctx",
        "outermost",
        "recording",
        "runtime",
        "sampled",
        "span",
        "spec",
        "state",
    )

    def __init__(
        self,
        spec: _Spec,
        runtime: Any,
        span: Any,
        state: Any,
        ctx: Any,
        outermost: bool,
        recording: bool,
    ) -> None:
        self.spec = spec
        self.runtime = runtime
        self.span = span
        self.state = state
        self.ctx = ctx
        self.outermost = outermost
        self.recording = recording
        self.sampled = state.sampled
        self.chat = False


# -- OpenTelemetry, bound on first use ----------------------------------------------------------


class _Otel:
    """Functions of OpenTelemetry and the runtime, bound once on the first decorated call."""

    loaded = False

    def load(self) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry.trace import (
            NonRecordingSpan,
            Status,
            StatusCode,
            get_current_span,
            set_span_in_context,
        )

        from recalltrace.tracer import _runtime
        from recalltrace.tracer._state import TraceState

        self.runtime_module = _runtime
        self.get_current = otel_context.get_current
        self.attach = otel_context.attach
        self.detach = otel_context.detach
        self.set_value = otel_context.set_value
        self.set_span_in_context = set_span_in_context
        self.get_current_span = get_current_span
        self.NonRecordingSpan = NonRecordingSpan
        from recalltrace.tracer._capture import mark_covered

        self.cover = mark_covered
        self.state_key = _runtime.STATE_KEY
        self.TraceState = TraceState
        self.Status = Status
        self.ERROR = StatusCode.ERROR
        self.loaded = True


_otel = _Otel()


def _runtime() -> Any:
    if not _otel.loaded:
        _otel.load()
    runtime = _otel.runtime_module.current
    if runtime is None:
        try:
            runtime = _otel.runtime_module.get()
        except ValueError:
            return None  # the refused configuration was said once; run untraced
    return runtime


# -- per call -----------------------------------------------------------------------------------


def _start(spec: _Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Call | None:
    """Open the span and the call; returns None (run the function plainly) when the tracer is
    disabled or failed."""
    try:
        runtime = _runtime()
        if runtime is None or not runtime.enabled:
            return None
        if spec.input_reader is not None:
            value = _read_input(spec, args, kwargs)
        elif spec.input is not None:
            value = _argument(spec.input, args, kwargs)
        else:
            value = _first_string(args, kwargs)
        attributes = spec.attributes
        if value is not None:
            attributes = _with_input(runtime, attributes, value, spec)
        otel = _otel
        parent = otel.get_current()
        state: Any = parent.get(otel.state_key)
        same_call = (
            None if spec.kind == RAG else _instrumented_call(spec, otel.get_current_span(parent))
        )
        if same_call is not None:
            # An instrumentor's span for this very call is current: no second span.
            span = otel.NonRecordingSpan(same_call)
        else:
            span = runtime.otel_tracer.start_span(spec.name, parent, attributes=attributes)
    except Exception:
        internal_error("opening a span")
        return None
    try:
        if (state is None or state.closed) and spec.kind != RAG:
            # A retrieval or generation with no request around it: its span is exported, but
            # a record without a question would only wait for scoring that cannot come.
            _outside_request(spec)
            state = _DETACHED
            ctx = otel.set_span_in_context(span, parent)
            outermost = False
        elif state is None or state.closed:
            record_id = _record_ids.getrandbits(128) or 1
            span_context = span.get_span_context()
            state = otel.TraceState(
                record_id,
                spec.name,
                runtime.sampler.should_sample(record_id, spec.name),
                time.time_ns(),
                time.perf_counter_ns(),
                span_context.trace_id,
                span_context.span_id,
            )
            ctx = otel.set_value(otel.state_key, state, otel.set_span_in_context(span, parent))
            outermost = True
        else:
            ctx = otel.set_span_in_context(span, parent)
            outermost = False
        call = _Call(spec, runtime, span, state, ctx, outermost, span.is_recording())
        if attributes is not spec.attributes and _FIRST_MESSAGE_ROLE in attributes:
            call.chat = True
        if state.sampled:
            if spec.kind == RAG and outermost:
                # A snapshot: the application may change the object after the call.
                state.user_input = snapshot(value)
                _capture_references(spec, state, args, kwargs)
            if spec.metadata:
                state.metadata.update(spec.metadata)
            if spec.tags and outermost:
                state.tags.extend(tag for tag in spec.tags if tag not in state.tags)
        return call
    except Exception:
        span.end()
        internal_error("opening a span")
        return None


_CALL_KINDS = {RETRIEVAL: ("RETRIEVER", "retrieval"), GENERATION: ("LLM", "chat")}


def _instrumented_call(spec: _Spec, current: Any) -> Any:
    """The span context of ``current`` when it is another instrumentation's span of the same
    kind of call (an OpenInference ``RETRIEVER``/``LLM`` or GenAI ``retrieval``/``chat``
    span), else None; span capture is told that the decorator records that call."""
    if not current.is_recording():
        return None
    scope = getattr(current, "instrumentation_scope", None)
    if scope is None or scope.name == "recalltrace":
        return None
    attributes = getattr(current, "attributes", None) or {}
    kind, operation = _CALL_KINDS[spec.kind]
    if attributes.get(SPAN_KIND) != kind and attributes.get(GEN_AI_OPERATION) != operation:
        return None
    context = current.get_span_context()
    _otel.cover(context.trace_id, context.span_id)
    return context


class _Detached:
    """The state of calls outside any request: nothing is captured for a record."""

    sampled = False
    closed = False
    last_error: BaseException | None = None


_DETACHED: Any = _Detached()
_warned_outside: set[str] = set()


def _outside_request(spec: _Spec) -> None:
    """Say once per function that its calls run outside any ``@rag`` request."""
    if spec.qualname in _warned_outside or len(_warned_outside) > 1000:
        return
    _warned_outside.add(spec.qualname)
    kind = "retrieval" if spec.kind == RETRIEVAL else "generation"
    logging.getLogger("recalltrace.tracer").warning(
        "recalltrace: %s %s ran outside any @recalltrace.rag request: its span is exported but "
        "no record is stored; decorate the request's entry point with @recalltrace.rag",
        kind,
        spec.qualname,
    )


def _with_input(runtime: Any, attributes: dict[str, Any], value: Any, spec: _Spec) -> Any:
    try:
        if isinstance(value, str):
            text = value
        elif is_plain_data(value):
            text = to_text(value) or ""
        else:
            # Printing an application object runs its code (a __str__ may be slow, hang or
            # raise): not on the request path. The span shows its type; the record gets its
            # text, read on the writer thread with a time bound.
            attributes = dict(attributes)
            attributes[INPUT_VALUE] = f"<{type(value).__name__}>"
            return attributes
        if runtime.span_scrub is not None:
            text = runtime.span_scrub(text)
    except Exception:
        user_code_error(f"reading the input of {spec.qualname}")
        return attributes
    attributes = dict(attributes)
    attributes[INPUT_VALUE] = text
    if not isinstance(value, str):
        attributes[INPUT_MIME_TYPE] = "application/json"
        if spec.kind == GENERATION:
            pairs = _chat_messages(value)
            if pairs is not None:
                _message_attributes(pairs, attributes, runtime.span_scrub, runtime.genai_attributes)
    elif spec.kind == RETRIEVAL and runtime.genai_attributes:
        attributes[GEN_AI_QUERY_TEXT] = text
    return attributes


def _capture_references(spec: _Spec, state: Any, args: tuple[Any, ...], kwargs: Any) -> None:
    if spec.reference is not None:
        value = _argument(spec.reference, args, kwargs)
        if value is not None:
            state.reference = snapshot(value)
    if spec.reference_contexts is not None:
        value = _argument(spec.reference_contexts, args, kwargs)
        if value is not None:
            state.reference_contexts = snapshot(value)
    if spec.reference_context_ids is not None:
        value = _argument(spec.reference_context_ids, args, kwargs)
        if value is not None:
            state.reference_context_ids = snapshot(value)


def _docs_of(spec: _Spec, result: Any) -> tuple[list[Doc], int]:
    """Every document of ``result``, read, and how many there are."""
    docs, _rest, total = _split_docs(spec, result, None)
    return docs, total


def _split_docs(
    spec: _Spec, result: Any, room: int | None, keep_rest: bool = True
) -> tuple[list[Doc], list[Any], int]:
    """The leading documents that fit in ``room`` span attributes, read (all of them when
    ``room`` is None); the rest as the retriever gave them (a shallow copy of its list, read
    later; empty unless ``keep_rest``); and the total."""
    try:
        if spec.extractor is not None:
            items = list(spec.extractor(result) or ())
        else:
            items = document_list(result) or []
        if room is None:
            return _read_rest(spec, items), [], len(items)
        docs: list[Doc] = []
        for item in items:
            if room <= 0:
                break
            try:
                doc = read_document(item)
            except Exception as exc:
                user_code_error(f"reading a document returned by {spec.qualname}")
                doc = unreadable(exc)
            room -= 1 + (doc.id is not None) + (doc.score is not None) + bool(doc.metadata)
            if room < 0:
                break
            docs.append(doc)
        rest = items[len(docs) :] if keep_rest else []
        return docs, rest, len(items)
    except Exception:
        user_code_error(f"reading the documents returned by {spec.qualname}")
        return [], [], 0


def _read_rest(spec: _Spec, items: list[Any]) -> list[Doc]:
    """Every one of ``items`` read; one whose reading raises is an empty stand-in (the record
    notes it) so it costs only itself."""
    docs: list[Doc] = []
    for item in items:
        try:
            docs.append(read_document(item))
        except Exception as exc:
            user_code_error(f"reading a document returned by {spec.qualname}")
            docs.append(unreadable(exc))
    return docs


def _attribute_room(span: Any) -> int | None:
    """How many more attributes the span keeps before the SDK starts evicting the oldest ones
    (the span kind and the input): ``None`` when the provider sets no limit we can read."""
    limit = getattr(getattr(span, "_limits", None), "max_span_attributes", None)
    if not isinstance(limit, int):
        return None
    present = getattr(span, "_attributes", None)
    return limit - (len(present) if present is not None else 0) - _ATTRIBUTE_RESERVE


def _document_attributes(
    call: _Call, docs: list[Doc], attributes: dict[str, Any], room: int | None
) -> int:
    """Put the documents on ``attributes`` in rank order while they fit in ``room``; returns
    how many were put (the record keeps every document whatever fits on the span)."""
    scrub = call.runtime.span_scrub
    for index, doc in enumerate(docs):
        if room is not None:
            needed = 1 + (doc.id is not None) + (doc.score is not None) + bool(doc.metadata)
            if needed > room:
                return index
            room -= needed
        keys = _DOC_KEYS[index] if index < _DOC_KEY_CACHE else _doc_keys(index)
        if scrub is None:
            if doc.id is not None:
                attributes[keys[0]] = doc.id
            attributes[keys[1]] = doc.content
            if doc.metadata:
                attributes[keys[3]] = metadata_json(doc.metadata)
        else:
            # Ids, and metadata keys and values (as their JSON text, where a sensitive key's
            # value is redacted whole), carry secrets as content does.
            if doc.id is not None:
                attributes[keys[0]] = scrub(doc.id)
            attributes[keys[1]] = scrub(doc.content)
            if doc.metadata:
                attributes[keys[3]] = scrub(metadata_json(doc.metadata))
        if doc.score is not None:
            attributes[keys[2]] = doc.score
    return len(docs)


def _finish_retrieval(call: _Call, result: Any) -> None:
    room = _attribute_room(call.span) if call.recording else None
    if room is not None:
        room -= _WITH_DOCUMENTS
    # A span takes only the documents that fit (at most one per attribute): those are read
    # now. The record needs every document: the rest are kept as a shallow copy of the
    # retriever's list and read on the writer thread, so k documents cost the request path
    # a list copy, not k reads.
    if not call.recording:
        room = 0
    docs, rest, total = _split_docs(call.spec, result, room, keep_rest=call.sampled)
    _finish_documents(call, docs, total, None)
    if call.sampled and rest:
        call.state.contexts.append(_DeferredDocs(call.spec, rest))


class _DeferredDocs:
    """Documents past what a span holds, read when the record is assembled."""

    __slots__ = ("items", "spec")

    def __init__(self, spec: _Spec, items: list[Any]) -> None:
        self.spec = spec
        self.items = items

    def read(self) -> list[Doc]:
        return _read_rest(self.spec, self.items)


def _finish_documents(call: _Call, docs: list[Doc], total: int, room: int | None) -> None:
    if call.recording and docs:
        attributes: dict[str, Any] = {}
        shown = _document_attributes(call, docs, attributes, room)
        if shown < total:
            attributes[DOCUMENTS_TOTAL] = total
            attributes[DOCUMENTS_ON_SPAN] = shown
        if shown and call.runtime.genai_attributes:
            attributes[GEN_AI_DOCUMENTS] = _genai_documents(docs[:shown], call.runtime.span_scrub)
        call.span.set_attributes(attributes)
    if call.sampled and docs:
        # The documents' metadata is not copied: like the documents past what the span holds,
        # it is read when the record is assembled (a retriever hands out its results; it does
        # not change them after).
        call.state.contexts.extend(docs)


def _genai_documents(docs: list[Doc], scrub: Any) -> str:
    """The GenAI conventions' ``gen_ai.retrieval.documents``: a JSON list of ``{id, score}``
    in rank order (the content is on the OpenInference attributes beside it), written
    directly (the same text as the JSON encoder's)."""
    entries: list[str] = []
    for doc in docs:
        doc_id, score = doc[1], doc[2]
        if doc_id is None:
            entry = ""
        else:
            entry = '"id": ' + quote_json(doc_id if scrub is None else scrub(doc_id))
        if score is not None:
            number = flat_json({"score": score})
            if number is None:
                return _genai_documents_encoded(docs, scrub)
            entry = number[1:-1] if not entry else entry + ", " + number[1:-1]
        entries.append("{" + entry + "}")
    return "[" + ", ".join(entries) + "]"


def _genai_documents_encoded(docs: list[Doc], scrub: Any) -> str:
    entries: list[dict[str, Any]] = []
    for doc in docs:
        entry: dict[str, Any] = {}
        if doc.id is not None:
            entry["id"] = doc.id if scrub is None else scrub(doc.id)
        if doc.score is not None:
            entry["score"] = doc.score
        entries.append(entry)
    return to_text(entries) or "[]"


def _chat_messages(value: Any) -> list[tuple[str, str]] | None:
    """``value`` as (role, text) pairs when it is a chat prompt of plain dicts (``role`` and a
    string or a list of text parts as ``content``), at most ``MAX_SPAN_MESSAGES`` of them;
    else None. Application objects are not read here (the request path runs no user code)."""
    if type(value) is not list or not value:
        return None
    pairs: list[tuple[str, str]] = []
    for item in value[:MAX_SPAN_MESSAGES]:
        if type(item) is not dict:
            return None
        role, content = item.get("role"), item.get("content")
        if type(role) is not str:
            return None
        if content is None:
            text = ""
        elif type(content) is str:
            text = content
        elif type(content) is list:
            text = "".join(
                part["text"]
                for part in content
                if type(part) is dict and type(part.get("text")) is str
            )
        else:
            return None
        pairs.append((role, text))
    return pairs


def _message_attributes(
    pairs: list[tuple[str, str]], attributes: dict[str, Any], scrub: Any, genai: bool
) -> None:
    """A chat prompt on a generation span: OpenInference's flattened messages and (``genai``)
    the GenAI conventions' ``gen_ai.input.messages``."""
    messages: list[dict[str, Any]] = []
    for index, (role, text) in enumerate(pairs):
        if scrub is not None:
            text = scrub(text)
        prefix = f"llm.input_messages.{index}.message."
        attributes[prefix + "role"] = role
        attributes[prefix + "content"] = text
        if genai:
            messages.append({"role": role, "parts": [{"type": "text", "content": text}]})
    if genai:
        attributes[GEN_AI_INPUT_MESSAGES] = to_text(messages)


def _finish_generation(
    call: _Call, text: str | None, model: str | None, usage: Usage | None
) -> None:
    if call.recording:
        genai = call.runtime.genai_attributes
        attributes: dict[str, Any] = {}
        if text is not None:
            scrub = call.runtime.span_scrub
            output = text if scrub is None else scrub(text)
            # Text output: no ``output.mime_type`` (OpenInference reads a missing one as text).
            attributes[OUTPUT_VALUE] = output
            if call.chat:
                attributes["llm.output_messages.0.message.role"] = "assistant"
                attributes["llm.output_messages.0.message.content"] = output
                if genai:
                    attributes[GEN_AI_OUTPUT_MESSAGES] = to_text(
                        [{"role": "assistant", "parts": [{"type": "text", "content": output}]}]
                    )
        if model is not None:
            attributes[LLM_MODEL_NAME] = model
            if genai:
                attributes[GEN_AI_RESPONSE_MODEL] = model
        if usage is not None:
            if usage.prompt is not None:
                attributes[LLM_PROMPT_TOKENS] = usage.prompt
                if genai:
                    attributes[GEN_AI_INPUT_TOKENS] = usage.prompt
            if usage.completion is not None:
                attributes[LLM_COMPLETION_TOKENS] = usage.completion
                if genai:
                    attributes[GEN_AI_OUTPUT_TOKENS] = usage.completion
            if usage.total is not None:
                attributes[LLM_TOTAL_TOKENS] = usage.total
        if attributes:
            call.span.set_attributes(attributes)
    if call.sampled:
        spec_model = call.spec.attributes.get(LLM_MODEL_NAME)
        call.state.generations.append((text, model or spec_model, usage))


def _finish_rag(call: _Call, answer: str | None) -> None:
    if answer is not None and call.recording:
        scrub = call.runtime.span_scrub
        call.span.set_attribute(OUTPUT_VALUE, answer if scrub is None else scrub(answer))
    if call.outermost and call.sampled and answer is not None:
        call.state.response = answer


def _answer_of(spec: _Spec, result: Any) -> str | None:
    if type(result) is str and spec.response_extractor is None:
        return result
    try:
        if spec.response_extractor is not None:
            value = spec.response_extractor(result)
            return None if value is None else to_text(value)
        return read_answer(result)
    except Exception:
        user_code_error(f"reading the response of {spec.qualname}")
        return None


def _generation_of(result: Any) -> tuple[str | None, str | None, Usage | None]:
    if type(result) is str:
        return result, None, None
    try:
        return read_generation_text(result), read_model(result), read_usage(result)
    except Exception:
        user_code_error("reading a generation's return value")
        return None, None, None


def _end(call: _Call) -> None:
    scrub = call.runtime.span_scrub
    if scrub is not None and call.recording:
        # Attributes the application set on this span itself (with the OpenTelemetry API)
        # are user text too; the tracer's own, scrubbed already, are recognised at once.
        scrub_span_attributes(call.span, scrub)
    try:
        call.span.end()
    except Exception:
        internal_error("ending a span")
    if call.outermost:
        state = call.state
        state.closed = True
        state.duration_ms = (time.perf_counter_ns() - state.start_perf_ns) / 1e6
        call.runtime.finish_trace(state)


def _streams_later(call: _Call, result: Any) -> bool:
    """Whether ``result`` is a response whose body is produced after the function returned
    (Starlette's and FastAPI's ``StreamingResponse``): the request is not over yet."""
    if call.spec.kind != RAG or not call.outermost:
        return False
    body = getattr(result, "body_iterator", None)
    return body is not None and hasattr(body, "__anext__")


async def _follow_stream(call: _Call, body: Any) -> Any:
    """The response body, passed through unchanged, inside the request's context; the request
    ends (and its record is made, with the streamed text as the answer) when the body does."""
    stream = _Stream()
    try:
        while True:
            token = _otel.attach(call.ctx)
            try:
                item = await body.__anext__()
            except StopAsyncIteration:
                _detach(token)
                break
            except BaseException as exc:
                _detach(token)
                _failed(call, exc, stream)
                raise
            _detach(token)
            if isinstance(item, (bytes, bytearray)):
                try:
                    text: Any = bytes(item).decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            else:
                text = item
            if text is not None:
                _stream_item(call, stream, text)
            yield item
    except GeneratorExit:
        _stream_finished(call, stream, closed_early=True)
        raise
    _stream_finished(call, stream, closed_early=False)


def _succeeded(call: _Call, result: Any) -> None:
    """Record a returned value and end the span (never raises)."""
    try:
        if _streams_later(call, result):
            result.body_iterator = _follow_stream(call, result.body_iterator)
            return
        kind = call.spec.kind
        if call.recording or call.sampled:
            if kind == RETRIEVAL:
                _finish_retrieval(call, result)
            elif kind == GENERATION:
                text, model, usage = _generation_of(result)
                _finish_generation(call, text, model, usage)
            else:
                _finish_rag(call, _answer_of(call.spec, result))
    except Exception:
        internal_error("ending a span")
    # Whatever failed above, the span ends and the request reaches the writer (or its count).
    _end_safely(call)


def _failed(call: _Call, exc: BaseException, stream: _Stream | None = None) -> None:
    """Record an exception (and what a stream yielded before it) and end the span; never
    raises (the caller re-raises ``exc``)."""
    try:
        if stream is not None:
            _stream_record(call, stream)
        if isinstance(exc, Exception):
            message, problem = _exception_message(exc)
            if call.recording:
                # An exception passing up through nested decorated calls is recorded, with
                # its stack trace, on the span it left first; the outer ones get the status
                # (formatting the trace at every level costs depth squared).
                scrub = call.runtime.span_scrub
                if call.state.last_error is not exc:
                    if scrub is None and problem is None:
                        call.span.record_exception(exc)
                    else:
                        # The message and the stack trace are user text like any other; a
                        # message that cannot be printed is replaced by a placeholder.
                        call.span.add_event("exception", _exception_attributes(exc, message, scrub))
                    call.state.last_error = exc
                call.span.set_status(_status(exc, message, scrub))
            if call.outermost:
                call.state.error = True
                if call.sampled and problem is not None:
                    call.state.notes.append(
                        f"the request raised {type(exc).__name__}, whose message could not be "
                        f"printed (its __str__ raised {problem}): stored with the type only"
                    )
        elif call.outermost and not isinstance(exc, GeneratorExit):
            call.state.error = True
            if call.sampled:
                call.state.notes.append(f"root interrupted by {type(exc).__name__}")
    except Exception:
        internal_error("ending a failed span")
    _end_safely(call)


def _end_safely(call: _Call) -> None:
    try:
        _end(call)
    except Exception:
        internal_error("ending a span")


def _exception_message(exc: BaseException) -> tuple[str, str | None]:
    """``str(exc)``, or a placeholder and the name of what printing it raised."""
    try:
        return str(exc), None
    except Exception as problem:
        name = type(problem).__name__
        return f"<{type(exc).__name__} message not printable: {name}>", name


def _exception_attributes(exc: BaseException, message: str, scrub: Any) -> dict[str, str]:
    """The attributes of an exception event (as the SDK's ``record_exception`` sets them)."""
    import traceback

    try:
        stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        stack = ""
    if scrub is not None:
        message, stack = scrub(message), scrub(stack)
    kind = type(exc)
    module = kind.__module__
    return {
        "exception.type": f"{module}.{kind.__qualname__}"
        if module and module != "builtins"
        else kind.__qualname__,
        "exception.message": message,
        "exception.stacktrace": stack,
        "exception.escaped": "False",
    }


def _status(exc: BaseException, message: str, scrub: Any) -> Any:
    description = f"{type(exc).__name__}: {message}"
    return _otel.Status(_otel.ERROR, description if scrub is None else scrub(description))


def call_status(exc: BaseException, scrub: Any = None) -> Any:
    """The ERROR status OpenTelemetry's own context managers set for ``exc`` (its description
    scrubbed when span scrubbing is on)."""
    return _status(exc, _exception_message(exc)[0], scrub)


def _detach(token: Any) -> None:
    try:
        _otel.detach(token)
    except Exception:
        internal_error("restoring the context")


# -- streamed results (generators) --------------------------------------------------------------


class _Stream:
    """What a generator wrapper accumulates across yields."""

    __slots__ = ("docs", "model", "texts", "usage")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.docs: list[Doc] = []
        self.model: str | None = None
        self.usage: Usage | None = None


def _stream_item(call: _Call, stream: _Stream, item: Any) -> None:
    if not (call.recording or call.sampled):
        return
    try:
        kind = call.spec.kind
        if kind == RETRIEVAL:
            if call.spec.extractor is not None:
                stream.docs.extend(_docs_of(call.spec, item)[0])
            elif isinstance(item, (list, tuple)) and not (
                len(item) == 2 and isinstance(item[1], (int, float))
            ):
                stream.docs.extend(read_document(doc) for doc in item)
            else:
                stream.docs.append(read_document(item))
            return
        text = read_chunk_text(item) if kind == GENERATION else _stream_answer(call.spec, item)
        if text:
            stream.texts.append(text)
        if kind == GENERATION and not isinstance(item, str):
            model = read_model(item)
            if model is not None:
                stream.model = model
            usage = read_usage(item)
            if usage is not None:
                stream.usage = usage
    except Exception:
        user_code_error(f"reading an item yielded by {call.spec.qualname}")


def _stream_answer(spec: _Spec, item: Any) -> str | None:
    if spec.response_extractor is not None:
        value = spec.response_extractor(item)
        return None if value is None else to_text(value)
    return read_chunk_text(item)


def _stream_record(call: _Call, stream: _Stream) -> None:
    if call.recording or call.sampled:
        kind = call.spec.kind
        if kind == RETRIEVAL:
            room = _attribute_room(call.span) if call.recording else None
            _finish_documents(
                call,
                stream.docs,
                len(stream.docs),
                None if room is None else room - _WITH_DOCUMENTS,
            )
        elif kind == GENERATION:
            text = "".join(stream.texts) if stream.texts else None
            _finish_generation(call, text, stream.model, stream.usage)
        else:
            _finish_rag(call, "".join(stream.texts) if stream.texts else None)


def _stream_finished(call: _Call, stream: _Stream, closed_early: bool) -> None:
    try:
        if closed_early and call.outermost and call.sampled:
            call.state.notes.append("stream closed by the caller before its end")
        _stream_record(call, stream)
        _end(call)
    except Exception:
        internal_error("ending a streamed span")


# -- wrappers -----------------------------------------------------------------------------------


# Record ids come from a generator of our own, seeded from the operating system (and again in
# every forked child): an application calling random.seed() cannot make them repeat, and a
# request does not pay a system call for its id.
_record_ids = random.Random(urandom(32))


def _reseed_record_ids() -> None:
    _record_ids.seed(urandom(32))


at_fork_in_child(FORK_IDS, _reseed_record_ids)

# A decorated call adds one Python frame (the wrapper) to the stack, so a decorated recursive
# function would hit the recursion limit at half the depth. Past _DEEP nested decorated calls in
# a thread, the limit is raised by exactly the frames the wrappers add, and given back when the
# outermost call returns (unless the application changed it meanwhile).
_DEEP = 32
_nesting = threading.local()


def _deeper() -> None:
    depth = getattr(_nesting, "depth", 0) + 1
    _nesting.depth = depth
    if depth == 1:
        _nesting.base = sys.getrecursionlimit()
        _nesting.raised = 0
    elif depth > _DEEP:
        wanted = _nesting.base + depth + 8
        if sys.getrecursionlimit() < wanted:
            sys.setrecursionlimit(wanted)
            _nesting.raised = wanted


def _shallower() -> None:
    depth = _nesting.depth - 1
    _nesting.depth = depth
    if depth == 0 and _nesting.raised:
        if sys.getrecursionlimit() == _nesting.raised:
            sys.setrecursionlimit(_nesting.base)
        _nesting.raised = 0


def _wrap_function(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _start(spec, args, kwargs)
        if call is None:
            return fn(*args, **kwargs)
        token = _otel.attach(call.ctx)
        _deeper()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _shallower()
            _detach(token)
            _failed(call, exc)
            raise
        _shallower()
        _detach(token)
        _succeeded(call, result)
        return result

    return wrapper


def _wrap_coroutine(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _start(spec, args, kwargs)
        if call is None:
            return await fn(*args, **kwargs)
        token = _otel.attach(call.ctx)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            _detach(token)
            _failed(call, exc)
            raise
        _detach(token)
        _succeeded(call, result)
        return result

    return wrapper


def _wrap_generator(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _start(spec, args, kwargs)
        if call is None:
            return (yield from fn(*args, **kwargs))
        attach = _otel.attach
        ctx = call.ctx
        stream = _Stream()
        token = attach(ctx)
        try:
            generator = fn(*args, **kwargs)
        except BaseException as exc:
            _detach(token)
            _failed(call, exc)
            raise
        _detach(token)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            token = attach(ctx)
            try:
                if to_throw is None:
                    item = generator.send(to_send)
                else:
                    thrown, to_throw = to_throw, None
                    item = generator.throw(thrown)
            except StopIteration as stop:
                _detach(token)
                _stream_finished(call, stream, closed_early=False)
                return stop.value
            except BaseException as exc:
                _detach(token)
                _failed(call, exc, stream)
                raise
            _detach(token)
            _stream_item(call, stream, item)
            try:
                to_send = yield item
            except GeneratorExit:
                token = attach(ctx)
                try:
                    generator.close()
                except BaseException as exc:
                    _detach(token)
                    _failed(call, exc, stream)
                    raise
                _detach(token)
                _stream_finished(call, stream, closed_early=True)
                raise
            except BaseException as exc:
                to_throw = exc
                to_send = None

    return wrapper


def _wrap_async_generator(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _start(spec, args, kwargs)
        if call is None:
            # Untraced, but still forwarding asend/athrow/aclose like the traced path.
            plain = fn(*args, **kwargs)
            sent: Any = None
            error: BaseException | None = None
            while True:
                try:
                    if error is None:
                        value = await plain.asend(sent)
                    else:
                        raised, error = error, None
                        value = await plain.athrow(raised)
                except StopAsyncIteration:
                    return
                try:
                    sent = yield value
                except GeneratorExit:
                    await plain.aclose()
                    raise
                except BaseException as exc:
                    error = exc
                    sent = None
        attach = _otel.attach
        ctx = call.ctx
        stream = _Stream()
        token = attach(ctx)
        try:
            generator = fn(*args, **kwargs)
        except BaseException as exc:
            _detach(token)
            _failed(call, exc)
            raise
        _detach(token)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            token = attach(ctx)
            try:
                if to_throw is None:
                    item = await generator.asend(to_send)
                else:
                    thrown, to_throw = to_throw, None
                    item = await generator.athrow(thrown)
            except StopAsyncIteration:
                _detach(token)
                _stream_finished(call, stream, closed_early=False)
                return
            except BaseException as exc:
                _detach(token)
                _failed(call, exc, stream)
                raise
            _detach(token)
            _stream_item(call, stream, item)
            try:
                to_send = yield item
            except GeneratorExit:
                token = attach(ctx)
                try:
                    await generator.aclose()
                except BaseException as exc:
                    _detach(token)
                    _failed(call, exc, stream)
                    raise
                _detach(token)
                _stream_finished(call, stream, closed_early=True)
                raise
            except BaseException as exc:
                to_throw = exc
                to_send = None

    return wrapper


def decorate(fn: Any, spec: _Spec) -> Any:
    """Wrap ``fn`` (a function, coroutine function, generator or async generator function,
    staticmethod or classmethod) according to ``spec``."""
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(decorate(fn.__func__, spec))
    if not callable(fn):
        raise TypeError(f"cannot trace {fn!r}: not callable")
    spec.qualname = getattr(fn, "__qualname__", spec.name)
    if inspect.isasyncgenfunction(fn):
        return _wrap_async_generator(fn, spec)
    if inspect.iscoroutinefunction(fn):
        return _wrap_coroutine(fn, spec)
    if inspect.isgeneratorfunction(fn):
        return _wrap_generator(fn, spec)
    return _wrap_function(fn, spec)


def signature_of(fn: Any) -> inspect.Signature | None:
    """The signature of ``fn`` (unwrapping static/class methods), or None if unavailable."""
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def locate(fn: Any, name: str | None) -> _Param | None:
    """Resolve the parameter ``name`` of ``fn`` once, at decoration time."""
    return _locate(signature_of(fn), name, getattr(fn, "__func__", fn))


def function_name(fn: Any) -> str:
    """Default span name of ``fn``."""
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    return str(getattr(target, "__name__", None) or type(target).__name__)
