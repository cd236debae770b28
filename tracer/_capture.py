"""Capture RAG requests from the spans the application's instrumentors already produce.

:class:`SpanCapture` is an OpenTelemetry span processor. It keeps the finished spans of each
OpenTelemetry trace until the outermost span this process opened for it ends, then finds the
requests in them (see :mod:`._capture_build` for the rules) and hands one trace state per
request to the tracer's writer: the same sampling, scrubbing, bounded queue and storage as the
decorators. Reading the spans' attributes into a record happens on the writer thread.

Inside a ``@recalltrace.rag`` request, the instrumentors' retrievals and model calls join the
decorator's record instead of making one of their own; a call the decorators recorded too
(a decorated function inside an instrumented one, or the other way round) is kept once.

Memory is bounded: at most ``max_open_traces`` traces and ``max_spans_per_trace`` spans each
are held; a trace left open longer than ``open_trace_timeout`` seconds, or pushed out by the
cap, is dropped and counted (``capture_timeout``, ``capture_evicted``, ``capture_spans``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from recalltrace.tracer._capture_build import (
    LLM,
    OI_KIND,
    RERANKER,
    RETRIEVER,
    RequestParts,
    SpanView,
    app_name_of,
    build_parts,
    children_index,
    find_requests,
    request_attributes,
    resource_labels,
    role_of,
)
from recalltrace.tracer._internal import FORK_CAPTURE, at_fork_in_child
from recalltrace.tracer._state import TraceState
from recalltrace.tracer._writer import add_cycle_hook

logger = logging.getLogger("recalltrace.tracer")

RECALLTRACE_SCOPE = "recalltrace"
_SWEEP_EVERY = 1.0
# Finished subtrees waiting for the writer thread before it is woken at once (else it finds
# them at its next cycle, within flush_interval).
_WAKE_AT = 64


class CapturedState(TraceState):
    """A request found in spans; its record fields are read from them on the writer thread."""

    __slots__ = ("_children", "_root")

    _root: SpanView | None
    _children: Mapping[int | None, list[SpanView]] | None

    def prepare(self) -> None:
        """Fill the record fields from the request's spans (called by record assembly)."""
        root, children = self._root, self._children
        if root is None or children is None:
            return
        self._root = None
        self._children = None
        parts = build_parts(root, children)
        self.user_input = parts.question
        self.response = parts.answer
        self.contexts = list(parts.contexts)
        self.generations = parts.generations
        self.notes.extend(parts.notes)
        self.metadata.update(parts.metadata)
        self.metadata["captured_from"] = "spans"
        self.user_id, self.session_id, self.tags = request_attributes(root, children)
        # The process that served the request says which release it ran (its resource); the
        # receiving process's own release is the fallback at assembly.
        self.release, self.environment = root.release, root.environment


class _Trace:
    """The spans of one OpenTelemetry trace seen so far in this process."""

    __slots__ = ("dropped", "ended", "mapped", "open", "touched")

    def __init__(self, now: float) -> None:
        self.open: dict[int, int | None] = {}  # open span id -> its local parent's id
        self.ended: list[SpanView] = []
        self.mapped: dict[int, int] = {}  # span id -> root span id of its decorated request
        self.touched = now
        self.dropped = 0


class _Group:
    """The instrumentors' spans of one decorated request, whatever trace they are in."""

    __slots__ = ("covered", "state", "touched", "views")

    def __init__(self, state: Any, now: float) -> None:
        self.state = state
        self.views: list[SpanView] = []
        self.covered: set[int] = set()
        self.touched = now


class _Counter:
    """Drops of one kind: counted through the tracer's stats, said once in the log."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        self.said = False

    def add(self, count: int = 1) -> None:
        from recalltrace.tracer import _runtime

        _runtime.stats().drop(self.reason, "", count)
        if not self.said:
            self.said = True
            logger.warning(self.message, count)


class RequestAssembler:
    """Turns finished spans into trace states and offers them to the tracer's writer.

    Used by :class:`SpanCapture` (in process) and by ``recalltrace collect`` (OTLP): both
    feed it :class:`SpanView` objects and say when a subtree is complete.
    """

    def __init__(self, app_name: str | None = None) -> None:
        self.app_name = app_name
        self.outside = _Counter(
            "capture_outside_request",
            "recalltrace: %d retrieval or model span(s) ran outside any request (no chain, "
            "agent or workflow span around them): they are not stored (said once)",
        )
        self.no_retrieval = _Counter(
            "capture_no_retrieval",
            "recalltrace: %d chain, agent or workflow span(s) held no retrieval: not a RAG "
            "request, not stored (said once)",
        )

    def finish(self, top: SpanView, spans: Iterable[SpanView]) -> int:
        """The requests in the subtree of ``top`` (``spans`` holds it), offered to the writer;
        returns how many were found."""
        children = children_index(spans)
        roots, stray = find_requests(top, children)
        if stray:
            self.outside.add(len(stray))
        found = 0
        for root in roots:
            retrieves, decorated = _scan(root, children)
            if decorated:
                continue  # the decorated @rag request inside made its own record
            if not retrieves:
                self.no_retrieval.add()
                continue
            self.offer(root, children)
            found += 1
        return found

    def offer(self, root: SpanView, children: Mapping[int | None, list[SpanView]]) -> bool:
        """Hand the request rooted at ``root`` to the writer (sampled like a decorated one)."""
        runtime = _runtime_now()
        if not runtime.enabled:
            return False
        record_id = _new_record_id()
        app = self.app_name or app_name_of(root)
        sampled = runtime.sampler.should_sample(record_id, app)
        if not sampled:
            # Counted like any request; nothing else is built for one that is not stored.
            runtime.stats.trace_finished(app, False)
            return False
        state = CapturedState(
            record_id,
            app,
            sampled,
            root.start,
            0,
            root.trace_id,
            root.span_id,
        )
        state.duration_ms = max(root.end - root.start, 0) / 1e6
        state.error = root.error
        state.closed = True
        state._root = root
        state._children = children
        state.service_name = root.service or runtime.service_name
        runtime.stats.trace_finished(app, True)
        return bool(runtime.writer.offer(state))


_modules: dict[str, Any] = {}


def _runtime_now() -> Any:
    runtime_module = _modules.get("runtime")
    if runtime_module is None:
        from recalltrace.tracer import _runtime

        runtime_module = _modules["runtime"] = _runtime
    return runtime_module.current or runtime_module.get()


def _new_record_id() -> int:
    ids = _modules.get("ids")
    if ids is None:
        from recalltrace.tracer._decorators import _record_ids

        ids = _modules["ids"] = _record_ids
    return int(ids.getrandbits(128)) or 1


def merge_into_state(state: Any, parts: RequestParts) -> None:
    """Add what the instrumentors' spans of a decorated request saw to its state."""
    if not getattr(state, "sampled", False) or state.closed:
        return
    state.contexts.extend(parts.contexts)
    state.generations.extend(parts.generations)
    state.notes.extend(parts.notes)


_Labels = tuple[str | None, str | None, str | None]
_services: dict[int, tuple[Any, _Labels]] = {}
_NO_LABELS: _Labels = (None, None, None)


def _labels_of(resource: Any) -> _Labels:
    """Service name, release and environment of a span's resource (remembered per resource
    object)."""
    if resource is None:
        return _NO_LABELS
    known = _services.get(id(resource))
    if known is not None and known[0] is resource:
        return known[1]
    labels = resource_labels(resource.attributes)
    if len(_services) < 64:
        _services[id(resource)] = (resource, labels)
    return labels


def _view(span: Any) -> SpanView:
    """A :class:`SpanView` of an SDK ``ReadableSpan`` (its fields read directly: the public
    properties copy the attributes and events)."""
    try:
        context = span._context
        parent = span._parent
        attributes = span._attributes
        events = span._events
        status = span._status
        resource = span._resource
        scope = span._instrumentation_scope
        start, end = span._start_time, span._end_time
    except AttributeError:
        context = span.get_span_context()
        parent = span.parent
        attributes = span.attributes
        events = span.events
        status = span.status
        resource = getattr(span, "resource", None)
        scope = span.instrumentation_scope
        start, end = span.start_time, span.end_time
    # An ended SDK span's attributes no longer change: their plain dict is read from here on
    # (a BoundedAttributes lookup is a Python call; a dict's is not).
    attributes = getattr(attributes, "_dict", attributes)
    service, release, environment = _labels_of(resource)
    return SpanView(
        span.name,
        context.trace_id,
        context.span_id,
        parent.span_id if parent is not None else None,
        start or 0,
        end or 0,
        attributes if attributes is not None else {},
        [(event.name, event.attributes or {}) for event in events] if events else (),
        status is not None and status.status_code.value == 2,
        service,
        scope.name if scope is not None else "",
        release,
        environment,
    )


_instances: weakref.WeakSet[SpanCapture] = weakref.WeakSet()


def mark_covered(trace_id: int, span_id: int) -> None:
    """A decorator recorded the call of this instrumentor span itself: span capture leaves it
    out of the decorated request's record."""
    for capture in list(_instances):
        capture.cover(trace_id, span_id)


class SpanCapture:
    """An OpenTelemetry span processor that stores the RAG requests in the application's spans.

    Add it to the TracerProvider the instrumentors use, or let
    ``recalltrace.configure(capture_spans=True)`` do so::

        provider.add_span_processor(recalltrace.SpanCapture())

    It reads OpenInference, OpenTelemetry GenAI and OpenLLMetry attributes (see
    ``docs/ingest.md``), and stores one record per request through the configured tracer.

    - ``app_name``: the app name of every record (default: the workflow or agent name the
      spans carry, else the request's root span name).
    - ``max_open_traces`` / ``max_spans_per_trace``: the bound on what is held in memory.
    - ``open_trace_timeout``: seconds a trace may stay open before it is dropped and counted.
    """

    def __init__(
        self,
        *,
        app_name: str | None = None,
        max_open_traces: int = 10_000,
        max_spans_per_trace: int = 5_000,
        open_trace_timeout: float = 300.0,
    ) -> None:
        if max_open_traces < 1 or max_spans_per_trace < 1 or not open_trace_timeout > 0:
            raise ValueError(
                "max_open_traces and max_spans_per_trace must be at least 1 and "
                "open_trace_timeout positive"
            )
        self.assembler = RequestAssembler(app_name)
        self.max_open_traces = max_open_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.open_trace_timeout = open_trace_timeout
        self._traces: dict[int, _Trace] = {}
        self._groups: dict[int, _Group] = {}
        self._lock = threading.Lock()
        self._next_sweep = time.monotonic() + _SWEEP_EVERY
        self._evicted = _Counter(
            "capture_evicted",
            "recalltrace: %d open trace(s) were pushed out of span capture by the "
            "max_open_traces bound before their request ended: not stored (said once)",
        )
        self._timed_out = _Counter(
            "capture_timeout",
            "recalltrace: %d trace(s) stayed open longer than open_trace_timeout in span "
            "capture: not stored (said once)",
        )
        self._too_many = _Counter(
            "capture_spans",
            "recalltrace: %d span(s) past max_spans_per_trace were left out of their "
            "request's record (said once)",
        )
        self._backlog = _Counter(
            "capture_backlog",
            "recalltrace: %d finished trace(s) found max_open_traces already waiting for the "
            "writer thread in span capture: not stored (said once)",
        )
        # Subtrees whose spans have all ended: the requests in them are found, sampled and
        # queued on the writer thread (see finish_pending), not on the application's.
        self._finished: deque[list[tuple[SpanView, list[SpanView]]]] = deque()
        self._state_key: Any = None
        self._get_current: Any = None
        self.active = True
        _instances.add(self)
        add_cycle_hook(_finish_all_pending)

    def finish_pending(self) -> None:
        """Find the requests in the subtrees that ended and hand them to the writer (called
        by the writer thread at each cycle and by every flush)."""
        pending = self._finished
        while pending:
            try:
                tops = pending.popleft()
            except IndexError:
                return
            for top, spans in tops:
                try:
                    if top.scope == RECALLTRACE_SCOPE and not _has_instrumented(top, spans):
                        continue  # the decorators made the record, or said why not
                    self.assembler.finish(top, spans)
                except Exception:
                    from recalltrace.tracer._internal import internal_error

                    internal_error("finding the requests in finished spans")

    def _hand_over(self, tops: list[tuple[SpanView, list[SpanView]]]) -> None:
        runtime = _runtime_now()
        if not runtime.enabled:
            return
        pending = self._finished
        if len(pending) >= self.max_open_traces:
            self._backlog.add(len(tops))
            return
        pending.append(tops)
        runtime.writer.wake(now=len(pending) >= _WAKE_AT)

    def cover(self, trace_id: int, span_id: int) -> None:
        """Leave span ``span_id`` out of a decorated request's record (the decorator has it)."""
        with self._lock:
            for group in self._groups.values():
                if group.state.otel_trace_id == trace_id:
                    group.covered.add(span_id)

    # -- SpanProcessor -------------------------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Note the span as open (and the decorated request it belongs to, if any)."""
        if not self.active:
            return
        try:
            self._on_start(span, parent_context)
        except Exception:
            from recalltrace.tracer._internal import internal_error

            internal_error("capturing a span's start")

    def _on_start(self, span: Any, parent_context: Any) -> None:
        if self._state_key is None:
            from opentelemetry import context as otel_context

            from recalltrace.tracer._runtime import STATE_KEY

            self._state_key = STATE_KEY
            self._get_current = otel_context.get_current
        try:  # the SDK span's fields, read directly (the properties cost a call each)
            context, parent = span._context, span._parent
        except AttributeError:
            context, parent = span.get_span_context(), span.parent
        local_parent = parent.span_id if parent is not None and not parent.is_remote else None
        ctx = parent_context if parent_context is not None else self._get_current()
        state = ctx.get(self._state_key)
        if state is not None and (state.closed or not state.sampled):
            state = None
        now = time.monotonic()
        evicted = timed_out = 0
        with self._lock:
            trace = self._traces.get(context.trace_id)
            if trace is None:
                if len(self._traces) >= self.max_open_traces:
                    del self._traces[next(iter(self._traces))]
                    evicted = 1
                trace = self._traces[context.trace_id] = _Trace(now)
            trace.touched = now
            if local_parent is not None and local_parent not in trace.open:
                local_parent = None  # started on another provider, or already ended
            trace.open[context.span_id] = local_parent
            if state is not None:
                group = self._groups.get(state.otel_span_id)
                if group is None:
                    if len(self._groups) >= self.max_open_traces:
                        del self._groups[next(iter(self._groups))]
                        evicted += 1
                    group = self._groups[state.otel_span_id] = _Group(state, now)
                group.touched = now
                trace.mapped[context.span_id] = state.otel_span_id
                if local_parent is not None and _is_decorator_call(span):
                    group.covered.add(local_parent)
            if now >= self._next_sweep:
                timed_out = self._sweep(now)
        if evicted:
            self._evicted.add(evicted)
        if timed_out:
            self._timed_out.add(timed_out)

    def _sweep(self, now: float) -> int:
        self._next_sweep = now + _SWEEP_EVERY
        limit = now - self.open_trace_timeout
        stale = [trace_id for trace_id, trace in self._traces.items() if trace.touched < limit]
        for trace_id in stale:
            del self._traces[trace_id]
        old_groups = [key for key, group in self._groups.items() if group.touched < limit]
        for key in old_groups:
            del self._groups[key]
        return len(stale) + len(old_groups)

    def _on_ending(self, span: Any) -> None:
        """Called by newer SDKs just before a span ends; nothing to do then."""

    def on_end(self, span: Any) -> None:
        """Keep the finished span; when this process's outermost span of its trace ends,
        turn the requests in it into records."""
        if not self.active:
            return
        try:
            self._on_end(span)
        except Exception:
            from recalltrace.tracer._internal import internal_error

            internal_error("capturing a finished span")

    def _on_end(self, span: Any) -> None:
        view = _view(span)
        too_many = 0
        tops: list[tuple[SpanView, list[SpanView]]] = []
        with self._lock:
            trace = self._traces.get(view.trace_id)
            group = self._groups.pop(view.span_id, None)  # a decorated request's root span
            if trace is None:
                if group is None:
                    return  # evicted or timed out: already counted
            else:
                trace.touched = time.monotonic()
                parent = trace.open.pop(view.span_id, None)
                root_id = trace.mapped.pop(view.span_id, None)
                member = self._groups.get(root_id) if root_id is not None else None
                if root_id is not None:
                    if member is not None and len(member.views) < self.max_spans_per_trace:
                        member.views.append(view)
                    elif member is not None:
                        too_many = 1
                elif len(trace.ended) < self.max_spans_per_trace:
                    trace.ended.append(view)
                else:
                    trace.dropped += 1
                    too_many = 1
                if not trace.open:
                    # Nothing of this trace is open here any more: every ended span whose
                    # parent is not among them is the top of a subtree.
                    del self._traces[view.trace_id]
                    spans, trace.ended = trace.ended, []
                    ids = {s.span_id for s in spans}
                    tops = [(s, spans) for s in spans if s.parent_id not in ids]
                elif root_id is None and parent not in trace.open:
                    tops = [(view, _take_subtree(trace, view))]
        if too_many:
            self._too_many.add(too_many)
        if group is not None:
            self._merge(view, group)
        if tops:
            self._hand_over(tops)

    def _merge(self, root: SpanView, group: _Group) -> None:
        """The decorator's ``@rag`` span ended: the instrumentors' calls inside it join the
        decorator's record (each call once)."""
        views = group.views
        if not views:
            return
        children = children_index(views)
        ids = {view.span_id for view in views}
        children[root.span_id] = sorted(
            (view for view in views if view.parent_id not in ids), key=lambda v: v.start
        )
        skip = group.covered | _recorded_by_decorators(views)
        merge_into_state(group.state, build_parts(root, children, skip, root_is_request=False))

    def shutdown(self) -> None:
        """Hand the finished requests to the writer and forget the open traces."""
        self.finish_pending()
        with self._lock:
            self._traces.clear()
            self._groups.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand the finished requests to the tracer's writer (``recalltrace.flush()`` stores
        them)."""
        self.finish_pending()
        return True


def _finish_all_pending() -> None:
    for capture in list(_instances):
        capture.finish_pending()


def _forget_pending_in_child() -> None:
    # A forked child must not store its parent's requests a second time.
    for capture in list(_instances):
        capture._finished.clear()


at_fork_in_child(FORK_CAPTURE, _forget_pending_in_child)


def _take_subtree(trace: _Trace, top: SpanView, keep: bool = False) -> list[SpanView]:
    """``top`` and its ended descendants, removed from ``trace`` unless ``keep``."""
    if not trace.open and not keep:
        spans, trace.ended = trace.ended, []
        return spans
    members = {top.span_id}
    changed = True
    remaining = trace.ended
    while changed:
        changed = False
        for view in remaining:
            if view.span_id not in members and view.parent_id in members:
                members.add(view.span_id)
                changed = True
    spans = [view for view in remaining if view.span_id in members]
    if not keep:
        trace.ended = [view for view in remaining if view.span_id not in members]
    return spans


def _scan(root: SpanView, children: Mapping[int | None, list[SpanView]]) -> tuple[bool, bool]:
    """Whether the request under ``root`` holds a retrieval (or reranker) span, and whether it
    holds a decorated ``@rag`` request (whose record the decorator made)."""
    retrieves = False
    stack = [root]
    while stack:
        span = stack.pop()
        if span.scope == RECALLTRACE_SCOPE and span.attributes.get(OI_KIND) == "CHAIN":
            return retrieves, True
        if span is not root and role_of(span) in (RETRIEVER, RERANKER):
            retrieves = True
        stack.extend(children.get(span.span_id, ()))
    return retrieves, False


def _is_decorator_call(span: Any) -> bool:
    """Whether an SDK span is a recalltrace ``@retrieval`` or ``@generation`` call."""
    scope = getattr(span, "instrumentation_scope", None)
    if scope is None or scope.name != RECALLTRACE_SCOPE:
        return False
    kind = (span.attributes or {}).get(OI_KIND)
    return kind in ("RETRIEVER", "LLM")


def _recorded_by_decorators(spans: list[SpanView]) -> set[int]:
    """The spans of calls a decorator recorded itself: the decorators' own retrieval and model
    spans, and an instrumentor's span of the same kind that a decorated call ran within (its
    child, or its sibling when the instrumentor does not make its span current, as
    OpenInference's LangChain tracer does)."""
    from recalltrace.tracer._capture_build import span_role

    decorated: list[tuple[SpanView, int]] = []
    others: list[tuple[SpanView, int]] = []
    for view in spans:
        role = span_role(view.attributes, view.events)
        if role not in (RETRIEVER, LLM):
            continue
        (decorated if view.scope == RECALLTRACE_SCOPE else others).append((view, role))
    skip = {view.span_id for view, _ in decorated}
    for view, role in others:
        for call, call_role in decorated:
            if (
                call_role == role
                and call.parent_id in (view.span_id, view.parent_id)
                and view.start <= call.start
                and call.end <= view.end
            ):
                skip.add(view.span_id)
                break
    return skip


def _has_instrumented(top: SpanView, spans: list[SpanView]) -> bool:
    """Whether an instrumentor's spans sit under this decorator span (a decorated retrieval
    outside any decorated request, around an instrumented chain)."""
    return any(view.scope != RECALLTRACE_SCOPE for view in spans if view is not top)


# -- configure(capture_spans=True) ---------------------------------------------------------------

_auto: SpanCapture | None = None
_attached: list[Any] = []  # providers the automatic processor was added to
_hooked = False


def configure_capture(runtime: Any) -> None:
    """Attach (or switch off) the automatic :class:`SpanCapture` for ``runtime``'s options:
    on the provider the tracer uses now, and on any provider the application installs later."""
    global _auto
    if _auto is None:
        if not runtime.config.capture_spans:
            return
        _auto = SpanCapture()
    _auto.active = bool(runtime.config.capture_spans)
    if _auto.active:
        _hook_set_tracer_provider()
        _attach(runtime.provider)


def _attach(provider: Any) -> None:
    if _auto is None or not hasattr(provider, "add_span_processor"):
        return
    if any(known is provider for known in _attached):
        return
    provider.add_span_processor(_auto)
    _attached.append(provider)


def _hook_set_tracer_provider() -> None:
    """Follow the application's provider when it is installed after ``configure()``.

    OpenTelemetry lets the global provider be set once. When the tracer installed its own
    only because there was none yet, the application's (Phoenix's ``register``, an OTel
    distro, a ``TracerProvider`` of its own) takes its place instead of being refused: the
    decorators' spans then go to the application's exporters, and span capture is attached
    to it. In every other case the application's call does what it always did.
    """
    global _hooked
    if _hooked:
        return
    from opentelemetry import trace as otel_trace

    original = otel_trace._set_tracer_provider

    def _set_tracer_provider(provider: Any, log: bool) -> None:
        from recalltrace.tracer import _runtime

        runtime = _runtime.current
        ours = _runtime._installed_provider
        if (
            runtime is not None
            and ours is not None
            and provider is not ours
            and otel_trace.get_tracer_provider() is ours
        ):
            _hand_over(otel_trace, runtime, provider)
        original(provider, log)
        if _auto is not None and _auto.active:
            _attach(provider)

    otel_trace._set_tracer_provider = _set_tracer_provider  # type: ignore[assignment]
    _hooked = True


def _hand_over(otel_trace: Any, runtime: Any, provider: Any) -> None:
    """Let ``provider`` replace the provider the tracer installed for want of one."""
    from opentelemetry.util._once import Once

    from recalltrace.tracer import _runtime

    otel_trace._TRACER_PROVIDER_SET_ONCE = Once()
    otel_trace._TRACER_PROVIDER = None
    _runtime._installed_provider = None
    runtime.provider = provider
    runtime.owns_provider = False
    runtime.otel_tracer = provider.get_tracer(_runtime.INSTRUMENTATION_NAME)
    if runtime.config.service_name is None:
        runtime.service_name = _runtime._resource_service_name(provider)
    logger.info("recalltrace: the application's TracerProvider replaces the one it had installed")
