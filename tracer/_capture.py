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

Each request is stored once: a span that arrives again (same trace id, span id and start time)
is left out, and the requests are offered through :class:`._assembler.RequestAssembler` (shared
with ``recalltrace collect``), which offers a request root once and derives a captured record's
id from its root span, so storage's idempotent writes absorb a later repeat
(``capture_duplicate``). A request traced by two instrumentors of different conventions is
stored from the preferred convention's spans (``capture_same_request``). Span capture is added
to a provider in the way that keeps the processors it holds (:func:`add_keeping_others`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from typing import Any

from recalltrace.tracer import _threads
from recalltrace.tracer._assembler import (
    Candidate,
    DropCounter,
    RequestAssembler,
    loaded_runtime,
    merge_into_state,
    runtime_now,
)
from recalltrace.tracer._capture_build import (
    CONVENTIONS,
    LLM,
    RETRIEVER,
    SpanView,
    build_parts,
    children_index,
    convention_of,
    span_role,
)
from recalltrace.tracer._conventions import RECALLTRACE_SCOPE, SPAN_KIND
from recalltrace.tracer._internal import (
    FORK_CAPTURE,
    add_cycle_hook,
    at_fork_in_child,
    on_configure,
    own_process,
)
from recalltrace.tracer._span_scrub import scrub_span
from recalltrace.tracer._span_views import ended_span_view

logger = logging.getLogger("recalltrace.tracer")
_sleep = _threads.original("time", "sleep")

_SWEEP_EVERY = 1.0
# Finished subtrees waiting for the writer thread before it is woken at once (else it finds
# them at its next cycle, within flush_interval).
_WAKE_AT = 64
# Spans' starts and ends noted for the writer thread before it is woken at once; at most so
# many are held (and at most twice max_open_traces), and a slice of so many is replayed at a
# time.
_WAKE_EVENTS = 512
_JOURNAL_LIMIT = 8192
_REPLAY_SLICE = 256


class _Trace:
    """The spans of one OpenTelemetry trace seen so far in this process."""

    __slots__ = ("dropped", "ended", "mapped", "open", "seen", "touched")

    def __init__(self, now: float) -> None:
        self.open: dict[int, int | None] = {}  # open span id -> its local parent's id
        self.ended: list[SpanView] = []
        self.seen: set[int] = set()  # ids of the spans that ended (a repeat is left out)
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
        self._lock = _threads.Lock()
        self._next_sweep = time.monotonic() + _SWEEP_EVERY
        self._evicted = DropCounter(
            "capture_evicted",
            "recalltrace: %d open trace(s) were pushed out of span capture by the "
            "max_open_traces bound before their request ended: not stored (said once)",
        )
        self._timed_out = DropCounter(
            "capture_timeout",
            "recalltrace: %d trace(s) stayed open longer than open_trace_timeout in span "
            "capture: not stored (said once)",
        )
        self._too_many = DropCounter(
            "capture_spans",
            "recalltrace: %d span(s) past max_spans_per_trace were left out of their "
            "request's record (said once)",
        )
        self._backlog = DropCounter(
            "capture_backlog",
            "recalltrace: %d finished trace(s) found max_open_traces already waiting for the "
            "writer thread in span capture: not stored (said once)",
        )
        # Subtrees whose spans have all ended: the requests in them are found, sampled and
        # queued on the writer thread (see finish_pending), not on the application's.
        self._finished: deque[tuple[float, list[tuple[SpanView, list[SpanView]]]]] = deque()
        self._state_key: Any = None
        self._get_current: Any = None
        # Spans' starts and ends noted on the application's threads, replayed in order on the
        # writer thread (see on_start); bounded by _journal_limit.
        self._journal: deque[Any] = deque()
        self._journal_limit = min(_JOURNAL_LIMIT, 2 * max_open_traces)
        self._finishing = _threads.RLock()
        self.active = True
        _instances.add(self)
        add_cycle_hook(_finish_all_pending)

    def finish_pending(self, settle: float = 0.0) -> None:
        """Find the requests in the subtrees that ended and hand them to the writer (called
        by the writer thread at each cycle and by every flush). With ``settle``, while two
        instrumentors of different conventions are at work, subtrees that ended less than
        ``settle`` seconds ago wait for the next cycle: the other instrumentor's trace of the
        same request ends moments later, and the two are matched together. A flush waits
        here for the writer's own pass to have offered what it took."""
        with self._finishing:
            self._finish_pending(settle)

    def _finish_pending(self, settle: float) -> None:
        self._replay()
        pending = self._finished
        candidates: list[Candidate] = []
        newest = (
            time.monotonic() - settle if settle and len(self.assembler.conventions) > 1 else None
        )
        try:
            while pending:
                if newest is not None and pending[0][0] > newest:
                    break  # the rest ended later still
                try:
                    _, tops = pending.popleft()
                except IndexError:
                    break
                for top, spans in tops:
                    try:
                        if top.scope == RECALLTRACE_SCOPE and not _has_instrumented(top, spans):
                            continue  # the decorators made the record, or said why not
                        candidates.extend(self.assembler.requests_in(top, spans))
                    except Exception:
                        from recalltrace.tracer._internal import internal_error

                        internal_error("finding the requests in finished spans")
        finally:
            if candidates:
                self.assembler.offer_all(candidates)

    def _hand_over(self, tops: list[tuple[SpanView, list[SpanView]]]) -> None:
        runtime = runtime_now()
        if not runtime.enabled:
            return
        pending = self._finished
        if len(pending) >= self.max_open_traces:
            self._backlog.add(len(tops))
            return
        conventions = self.assembler.conventions
        for top, _ in tops:
            convention = convention_of(top)
            if convention not in conventions and convention in CONVENTIONS:
                conventions.add(convention)
        pending.append((time.monotonic(), tops))
        runtime.writer.wake(now=len(pending) >= _WAKE_AT)

    def cover(self, trace_id: int, span_id: int) -> None:
        """Leave span ``span_id`` out of a decorated request's record (the decorator has it)."""
        with self._lock:
            self._replay_locked()
            for group in self._groups.values():
                if group.state.otel_trace_id == trace_id:
                    group.covered.add(span_id)

    # -- SpanProcessor ---------------------------------------------------------------------
    #
    # On the application's thread a span's start and end are only noted, in order, in the
    # journal (what a start needs of the request's context, the decorated request it belongs
    # to, is read there and then); the bookkeeping (open spans per trace, finding the finished
    # subtrees) runs on the writer thread, which replays the journal at each cycle and flush.
    # A span of an open decorated request is handled at once instead, after the journal, so
    # that the instrumentors' calls inside it join its state before the decorator closes it.
    # A journal that reaches its bound is replayed by the thread that filled it.

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Note the span as open (and the decorated request it belongs to, if any)."""
        if not self.active:
            return
        try:
            own_process()
            if self._state_key is None:
                self._bind_context()
            ctx = parent_context if parent_context is not None else self._get_current()
            state = ctx.get(self._state_key)
            if state is not None and (state.closed or not state.sampled):
                state = None
            if state is not None:
                with self._lock:
                    self._replay_locked()
                    self._start_locked(span, state, time.monotonic())
                return
            journal = self._journal
            journal.append((span, None, time.monotonic()))
            self._after_note(len(journal))
        except Exception:
            from recalltrace.tracer._internal import internal_error

            internal_error("capturing a span's start")

    def on_end(self, span: Any) -> None:
        """Keep the finished span; when this process's outermost span of its trace ends,
        turn the requests in it into records."""
        if not self.active:
            return
        try:
            if not _sdk_calls_on_ending():
                _scrub_ending(span)  # an older SDK: scrubbed for the processors after this
            if self._groups:  # a decorated request is open: its calls join it now
                with self._lock:
                    self._replay_locked()
                    self._end_locked(ended_span_view(span))
                return
            try:
                span._context  # noqa: B018 - an SDK span: read once replayed
            except AttributeError:
                span = ended_span_view(span)  # another implementation's: read now
            journal = self._journal
            journal.append(span)
            self._after_note(len(journal))
        except Exception:
            from recalltrace.tracer._internal import internal_error

            internal_error("capturing a finished span")

    def _on_ending(self, span: Any) -> None:
        """Called by the SDK (1.40 and later) as a span ends, before any processor's
        ``on_end``: with span scrubbing on, the instrumentations' spans are scrubbed here,
        before any exporter sees them (see :mod:`._span_scrub` for the invariant)."""
        if self.active:
            _scrub_ending(span)

    def _after_note(self, waiting: int) -> None:
        if waiting >= self._journal_limit:
            with self._lock:  # the writer is behind: replay here rather than hold more
                self._replay_locked()
        elif waiting == 1 or waiting % _WAKE_EVENTS == 0:
            runtime = runtime_now()
            if runtime.enabled:
                runtime.writer.wake(now=waiting >= _WAKE_EVENTS)

    def _bind_context(self) -> None:
        from opentelemetry import context as otel_context

        from recalltrace.tracer._runtime import STATE_KEY

        self._state_key = STATE_KEY
        self._get_current = otel_context.get_current

    def _replay(self) -> None:
        """Replay the journal (the writer thread, every flush), a slice at a time so that a
        span of a decorated request waits for the lock at most one slice."""
        journal = self._journal
        while journal:
            with self._lock:
                self._replay_locked(_REPLAY_SLICE)
            _sleep(0)  # the application's threads may take the GIL between slices

    def _replay_locked(self, limit: int = -1) -> None:
        journal = self._journal
        while journal and limit:
            limit -= 1
            event = journal.popleft()  # every pop is under the lock: it is still there
            try:
                if type(event) is tuple:
                    self._start_locked(*event)
                else:
                    self._end_locked(
                        event if isinstance(event, SpanView) else ended_span_view(event)
                    )
            except Exception:
                from recalltrace.tracer._internal import internal_error

                internal_error("capturing a span")

    def _start_locked(self, span: Any, state: Any, now: float) -> None:
        try:  # the SDK span's fields, read directly (the properties cost a call each)
            context, parent = span._context, span._parent
        except AttributeError:
            context, parent = span.get_span_context(), span.parent
        trace_id, span_id = context.trace_id, context.span_id
        local_parent = parent.span_id if parent is not None and not parent.is_remote else None
        trace = self._traces.get(trace_id)
        if trace is None:
            if len(self._traces) >= self.max_open_traces:
                del self._traces[next(iter(self._traces))]
                self._evicted.add(1)
            trace = self._traces[trace_id] = _Trace(now)
        trace.touched = now
        if local_parent is not None and local_parent not in trace.open:
            local_parent = None  # started on another provider, or already ended
        trace.open[span_id] = local_parent
        if state is not None:
            group = self._groups.get(state.otel_span_id)
            if group is None:
                if len(self._groups) >= self.max_open_traces:
                    del self._groups[next(iter(self._groups))]
                    self._evicted.add(1)
                group = self._groups[state.otel_span_id] = _Group(state, now)
            group.touched = now
            trace.mapped[span_id] = state.otel_span_id
            if local_parent is not None and _is_decorator_call(span):
                group.covered.add(local_parent)
        if now >= self._next_sweep:
            timed_out = self._sweep(now)
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

    def _end_locked(self, view: SpanView) -> None:
        tops: list[tuple[SpanView, list[SpanView]]] = []
        trace = self._traces.get(view.trace_id)
        group = self._groups.pop(view.span_id, None)  # a decorated request's root span
        if trace is None:
            if group is None:
                return  # evicted or timed out: already counted
        elif view.span_id in trace.seen:
            # ended again (a processor added twice, a span ended twice)
            self.assembler.duplicates.add(1)
        else:
            if len(trace.seen) < self.max_spans_per_trace:
                trace.seen.add(view.span_id)
            trace.touched = time.monotonic()
            parent = trace.open.pop(view.span_id, None)
            root_id = trace.mapped.pop(view.span_id, None)
            member = self._groups.get(root_id) if root_id is not None else None
            if root_id is not None:
                if member is not None and len(member.views) < self.max_spans_per_trace:
                    member.views.append(view)
                elif member is not None:
                    self._too_many.add(1)
            elif len(trace.ended) < self.max_spans_per_trace:
                trace.ended.append(view)
            else:
                trace.dropped += 1
                self._too_many.add(1)
            if not trace.open:
                # Nothing of this trace is open here any more: every ended span whose
                # parent is not among them is the top of a subtree.
                del self._traces[view.trace_id]
                spans, trace.ended = trace.ended, []
                ids = {s.span_id for s in spans}
                tops = [(s, spans) for s in spans if s.parent_id not in ids]
            elif root_id is None and parent not in trace.open:
                tops = [(view, _take_subtree(trace, view))]
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


_on_ending_called: list[bool] = []


def _sdk_calls_on_ending() -> bool:
    """Whether the SDK's spans call ``_on_ending`` of their processors (1.40 and later)."""
    if not _on_ending_called:
        try:
            from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
        except ImportError:
            _on_ending_called.append(False)
        else:
            _on_ending_called.append(hasattr(SynchronousMultiSpanProcessor, "_on_ending"))
    return _on_ending_called[0]


def _scrub_ending(span: Any) -> None:
    """Scrub an instrumentation's span that is ending, when span scrubbing is on (the
    decorators' spans were scrubbed before they ended)."""
    runtime = loaded_runtime()
    scrub = getattr(runtime, "span_scrub", None)
    if scrub is None:
        return
    scope = getattr(span, "instrumentation_scope", None)
    if scope is not None and scope.name == RECALLTRACE_SCOPE:
        return
    scrub_span(span, scrub)


# Seconds a finished subtree waits on the writer thread, while two instrumentors of
# different conventions are at work, for the other's trace of the same request (a flush hands
# everything over at once).
_PAIR_SETTLE = 0.5


def _finish_all_pending() -> None:
    settle = _PAIR_SETTLE if _on_writer_thread() else 0.0
    for capture in list(_instances):
        capture.finish_pending(settle)


def _on_writer_thread() -> bool:
    """Whether this is the writer thread's own cycle (not a flush from another thread)."""
    runtime = loaded_runtime()
    writer = getattr(runtime, "writer", None)
    return writer is not None and bool(writer.on_writer_thread())


def _forget_pending_in_child() -> None:
    # A forked child must not store its parent's requests a second time; a lock the
    # parent's writer thread held while replaying is never released in the child.
    for capture in list(_instances):
        capture._lock = _threads.Lock()
        capture._finishing = _threads.RLock()
        capture._journal.clear()
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


def _is_decorator_call(span: Any) -> bool:
    """Whether an SDK span is a recalltrace ``@retrieval`` or ``@generation`` call."""
    scope = getattr(span, "instrumentation_scope", None)
    if scope is None or scope.name != RECALLTRACE_SCOPE:
        return False
    kind = (span.attributes or {}).get(SPAN_KIND)
    return kind in ("RETRIEVER", "LLM")


def _recorded_by_decorators(spans: list[SpanView]) -> set[int]:
    """The spans of calls a decorator recorded itself: the decorators' own retrieval and model
    spans, and an instrumentor's span of the same kind that a decorated call ran within (its
    child, or its sibling when the instrumentor does not make its span current, as
    OpenInference's LangChain tracer does)."""
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
_attached: list[list[Any]] = []  # [provider, its inner SDK provider] span capture was added to
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


on_configure(configure_capture)


def _attach(provider: Any) -> None:
    if _auto is None or not hasattr(provider, "add_span_processor"):
        return
    if any(known[0] is provider for known in _attached):
        return
    add_keeping_others(provider, _auto)
    _attached.append([provider, _inner_of(provider)])
    add_cycle_hook(_follow_proxies)


def _inner_of(provider: Any) -> Any:
    """The SDK provider a proxy provider forwards to (Logfire's keeps it in ``provider`` and
    swaps it when configured again), or ``None``."""
    inner = getattr(provider, "provider", None)
    return inner if hasattr(inner, "_active_span_processor") else None


def _follow_proxies() -> None:
    """A proxy provider that swapped its SDK provider since span capture was added to it gets
    span capture again (through the proxy, at the writer's next cycle)."""
    if _auto is None or not _auto.active:
        return
    for known in _attached:
        provider, inner = known
        now = _inner_of(provider)
        if now is None or now is inner:
            continue
        known[1] = now
        held = _processors_of(now)
        if held is None or not any(processor is _auto for processor in held):
            add_keeping_others(provider, _auto)


# Keywords of ``add_span_processor`` that some providers take to keep what they hold
# (Arize Phoenix's TracerProvider replaces its default exporting processor unless told not to).
_KEEP_KEYWORDS = {"replace_default_processor": False}


def add_keeping_others(provider: Any, processor: Any) -> None:
    """Add ``processor`` to ``provider`` through its own ``add_span_processor``, asking it to
    keep the processors it holds when its signature offers a way to (the provider's internals
    are only read, to check that nothing it held went away)."""
    add = provider.add_span_processor
    keywords = {name: value for name, value in _KEEP_KEYWORDS.items() if _takes_keyword(add, name)}
    before = _processors_of(provider)
    add(processor, **keywords)
    after = _processors_of(provider)
    if before is None or after is None:
        return
    lost = sum(1 for held in before if not any(held is kept for kept in after))
    if lost:
        logger.warning(
            "recalltrace: adding span capture made %s drop %d span processor(s) it held "
            "(its own exporters): add recalltrace.SpanCapture() to it the way it keeps its "
            "processors, and leave capture_spans off",
            type(provider).__name__,
            lost,
        )


def _takes_keyword(function: Any, name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _processors_of(provider: Any) -> tuple[Any, ...] | None:
    """The span processors an SDK provider (or a proxy's inner SDK provider) holds, read only;
    ``None`` when they cannot be read."""
    for candidate in (provider, getattr(provider, "provider", None)):
        active = getattr(candidate, "_active_span_processor", None)
        held = getattr(active, "_span_processors", None)
        if isinstance(held, tuple):
            return held
    return None


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
