"""One decorated call, from opening its span to ending it: the decoration-time :class:`Spec`,
the per-call :class:`Call`, OpenTelemetry's functions bound on first use, the request's trace
state, exceptions, and the request path's own record ids and recursion allowance.

A call's kind (see :mod:`._kinds`) says what differs between a request, a retrieval and a
generation; everything else is the same for the three.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from os import urandom
from typing import Any, NamedTuple

from recalltrace.tracer._conventions import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
    FIRST_INPUT_MESSAGE_ROLE,
    GEN_AI_OPERATION,
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    JSON_MIME_TYPE,
    RECALLTRACE_SCOPE,
    SPAN_KIND,
)
from recalltrace.tracer._extract import is_plain_data, snapshot, to_text
from recalltrace.tracer._internal import internal_error, own_process, user_code_error
from recalltrace.tracer._kinds import Kind, Stream, record_stream, stream_item
from recalltrace.tracer._span_scrub import scrub_span


class Param(NamedTuple):
    """Where to find one argument: by keyword ``name``, else ``position``, else
    ``default`` (``missing`` when the parameter has no default)."""

    name: str
    position: int | None
    default: Any
    missing: bool


def _argument(param: Param, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if param.name in kwargs:
        return kwargs[param.name]
    if param.position is not None and param.position < len(args):
        return args[param.position]
    return None if param.missing else param.default


def _read_input(spec: Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
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


class Spec:
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

    def __init__(self, kind: Kind, name: str, attributes: dict[str, Any]) -> None:
        self.kind = kind
        self.name = name
        self.qualname = name
        self.attributes = attributes
        self.input: Param | None = None
        self.reference: Param | None = None
        self.reference_contexts: Param | None = None
        self.reference_context_ids: Param | None = None
        self.extractor: Callable[[Any], Any] | None = None
        self.response_extractor: Callable[[Any], Any] | None = None
        self.metadata: dict[str, Any] | None = None
        self.input_reader: Callable[..., Any] | None = None
        self.tags: list[str] | None = None


class Call:
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
        spec: Spec,
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


otel_api = _Otel()


def _runtime() -> Any:
    if not otel_api.loaded:
        otel_api.load()
    runtime = otel_api.runtime_module.current
    if runtime is None:
        try:
            runtime = otel_api.runtime_module.get()
        except ValueError:
            return None  # the refused configuration was said once; run untraced
    return runtime


# -- per call -----------------------------------------------------------------------------------


def start_call(spec: Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Call | None:
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
        otel = otel_api
        parent = otel.get_current()
        state: Any = parent.get(otel.state_key)
        same_call = (
            None if spec.kind.root else _instrumented_call(spec, otel.get_current_span(parent))
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
        if (state is None or state.closed) and not spec.kind.root:
            # A retrieval or generation with no request around it: its span is exported, but
            # a record without a question would only wait for scoring that cannot come.
            _outside_request(spec)
            state = _DETACHED
            ctx = otel.set_span_in_context(span, parent)
            outermost = False
        elif state is None or state.closed:
            own_process()
            record_id = new_record_id()
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
        call = Call(spec, runtime, span, state, ctx, outermost, span.is_recording())
        if attributes is not spec.attributes and FIRST_INPUT_MESSAGE_ROLE in attributes:
            call.chat = True
        if state.sampled:
            if outermost and spec.kind.root:
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


def _instrumented_call(spec: Spec, current: Any) -> Any:
    """The span context of ``current`` when it is another instrumentation's span of the same
    kind of call (an OpenInference ``RETRIEVER``/``LLM`` or GenAI ``retrieval``/``chat``
    span), else None; span capture is told that the decorator records that call."""
    if not current.is_recording():
        return None
    scope = getattr(current, "instrumentation_scope", None)
    if scope is None or scope.name == RECALLTRACE_SCOPE:
        return None
    attributes = getattr(current, "attributes", None) or {}
    kind, operation = spec.kind.foreign
    if attributes.get(SPAN_KIND) != kind and attributes.get(GEN_AI_OPERATION) != operation:
        return None
    context = current.get_span_context()
    otel_api.cover(context.trace_id, context.span_id)
    return context


class _Detached:
    """The state of calls outside any request: nothing is captured for a record."""

    sampled = False
    closed = False
    last_error: BaseException | None = None


_DETACHED: Any = _Detached()
_warned_outside: set[str] = set()


def _outside_request(spec: Spec) -> None:
    """Say once per function that its calls run outside any ``@rag`` request."""
    if spec.qualname in _warned_outside or len(_warned_outside) > 1000:
        return
    _warned_outside.add(spec.qualname)
    kind = spec.kind.label
    logging.getLogger("recalltrace.tracer").warning(
        "recalltrace: %s %s ran outside any @recalltrace.rag request: its span is exported but "
        "no record is stored; decorate the request's entry point with @recalltrace.rag",
        kind,
        spec.qualname,
    )


def _with_input(runtime: Any, attributes: dict[str, Any], value: Any, spec: Spec) -> Any:
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
        attributes[INPUT_MIME_TYPE] = JSON_MIME_TYPE
    spec.kind.input_attributes(value, text, attributes, runtime)
    return attributes


def _capture_references(spec: Spec, state: Any, args: tuple[Any, ...], kwargs: Any) -> None:
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


def _end(call: Call) -> None:
    scrub = call.runtime.span_scrub
    if scrub is not None and call.recording:
        # What the application set on this span itself with the OpenTelemetry API (its
        # attributes, name, events, links, status) is user text too; the tracer's own,
        # scrubbed already, is recognised at once. Before end(): no span processor has seen
        # the span yet, whatever the provider holds (see _span_scrub).
        scrub_span(call.span, scrub)
    try:
        call.span.end()
    except Exception:
        internal_error("ending a span")
    if call.outermost:
        state = call.state
        state.closed = True
        state.duration_ms = (time.perf_counter_ns() - state.start_perf_ns) / 1e6
        call.runtime.finish_trace(state)


def _streams_later(call: Call, result: Any) -> bool:
    """Whether ``result`` is a response whose body is produced after the function returned
    (Starlette's and FastAPI's ``StreamingResponse``): the request is not over yet."""
    if not call.outermost or not call.spec.kind.root:
        return False
    body = getattr(result, "body_iterator", None)
    return body is not None and hasattr(body, "__anext__")


async def _follow_stream(call: Call, body: Any) -> Any:
    """The response body, passed through unchanged, inside the request's context; the request
    ends (and its record is made, with the streamed text as the answer) when the body does."""
    stream = Stream()
    try:
        while True:
            token = otel_api.attach(call.ctx)
            try:
                item = await body.__anext__()
            except StopAsyncIteration:
                detach(token)
                break
            except BaseException as exc:
                detach(token)
                failed(call, exc, stream)
                raise
            detach(token)
            if isinstance(item, (bytes, bytearray)):
                try:
                    text: Any = bytes(item).decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            else:
                text = item
            if text is not None:
                stream_item(call, stream, text)
            yield item
    except GeneratorExit:
        stream_finished(call, stream, closed_early=True)
        raise
    stream_finished(call, stream, closed_early=False)


def succeeded(call: Call, result: Any) -> None:
    """Record a returned value and end the span (never raises)."""
    try:
        if _streams_later(call, result):
            result.body_iterator = _follow_stream(call, result.body_iterator)
            return
        if call.recording or call.sampled:
            call.spec.kind.finish(call, result)
    except Exception:
        internal_error("ending a span")
    # Whatever failed above, the span ends and the request reaches the writer (or its count).
    _end_safely(call)


def failed(call: Call, exc: BaseException, stream: Stream | None = None) -> None:
    """Record an exception (and what a stream yielded before it) and end the span; never
    raises (the caller re-raises ``exc``)."""
    try:
        if stream is not None:
            record_stream(call, stream)
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


def _end_safely(call: Call) -> None:
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
        EXCEPTION_TYPE: f"{module}.{kind.__qualname__}"
        if module and module != "builtins"
        else kind.__qualname__,
        EXCEPTION_MESSAGE: message,
        EXCEPTION_STACKTRACE: stack,
        EXCEPTION_ESCAPED: "False",
    }


def _status(exc: BaseException, message: str, scrub: Any) -> Any:
    description = f"{type(exc).__name__}: {message}"
    return otel_api.Status(otel_api.ERROR, description if scrub is None else scrub(description))


def detach(token: Any) -> None:
    try:
        otel_api.detach(token)
    except Exception:
        internal_error("restoring the context")


def stream_finished(call: Call, stream: Stream, closed_early: bool) -> None:
    try:
        if closed_early and call.outermost and call.sampled:
            call.state.notes.append("stream closed by the caller before its end")
        record_stream(call, stream)
        _end(call)
    except Exception:
        internal_error("ending a streamed span")


def new_record_id() -> int:
    """A request record's id: 128 bits from a generator of this process's own.

    The generator checks, on every draw, that it belongs to this process (its pid and parent
    pid); a copy made by any fork (uWSGI's workers forked from C, a child that skipped Python's
    fork hooks) is reseeded from the operating system before its first draw, so no copy of a
    process repeats its ids, and an application that seeds ``random`` changes nothing. Reading
    the operating system's randomness on every request would cost a system call that gives up
    the GIL: with a busy thread beside it, each call waited about 0.1 ms for it back."""
    global _owner
    here = (getpid(), getppid())
    if here != _owner:
        _record_ids.seed(urandom(32))
        _owner = here
    return _record_ids.getrandbits(128) or 1


_record_ids = random.Random(urandom(32))
_owner = (os.getpid(), os.getppid())
"""The process (pid, parent pid) that seeded ``_record_ids``."""
getpid, getppid = os.getpid, os.getppid


# A decorated call adds one Python frame (the wrapper) to the stack, so a decorated recursive
# function would hit the recursion limit at half the depth. Past _DEEP nested decorated calls in
# a thread, the limit is raised by exactly the frames the wrappers add, and given back when the
# outermost call returns (unless the application changed it meanwhile).
_DEEP = 32
_nesting = threading.local()


def deeper() -> None:
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


def shallower() -> None:
    depth = _nesting.depth - 1
    _nesting.depth = depth
    if depth == 0 and _nesting.raised:
        if sys.getrecursionlimit() == _nesting.raised:
            sys.setrecursionlimit(_nesting.base)
        _nesting.raised = 0
