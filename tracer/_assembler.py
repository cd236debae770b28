"""Requests found in spans, made into trace states and offered to the tracer's writer.

:class:`RequestAssembler` is shared by span capture (spans of this process) and ``recalltrace
collect`` (spans received over OTLP): both hand it :class:`SpanView` objects. It samples a
request like a decorated one, stores each request once (a root offered lately is not offered
again; a record id derived from the root span lets storage absorb a later repeat), and keeps one
of a request that two instrumentors of different conventions traced.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from recalltrace.tracer import _threads
from recalltrace.tracer._capture_build import (
    CONVENTIONS,
    RERANKER,
    RETRIEVER,
    RequestParts,
    SpanView,
    app_name_of,
    build_parts,
    children_index,
    convention_of,
    find_requests,
    request_attributes,
    role_of,
    root_question,
)
from recalltrace.tracer._conventions import RECALLTRACE_SCOPE, SPAN_KIND
from recalltrace.tracer._state import TraceState

logger = logging.getLogger("recalltrace.tracer")


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
        self.metadata["span_convention"] = convention_of(root)
        self.user_id, self.session_id, self.tags = request_attributes(root, children)
        # The process that served the request says which release it ran (its resource); the
        # receiving process's own release is the fallback at assembly.
        self.release, self.environment = root.release, root.environment


class DropCounter:
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
        self.duplicates = DropCounter(
            "capture_duplicate",
            "recalltrace: %d span(s) or request(s) arrived again (same trace id, span id and "
            "start time, as an export retried after a lost response sends them): each is "
            "stored once (said once)",
        )
        self.outside = DropCounter(
            "capture_outside_request",
            "recalltrace: %d retrieval or model span(s) ran outside any request (no chain, "
            "agent or workflow span around them): they are not stored (said once)",
        )
        self.no_retrieval = DropCounter(
            "capture_no_retrieval",
            "recalltrace: %d chain, agent or workflow span(s) held no retrieval: not a RAG "
            "request, not stored (said once)",
        )
        self.same_request = DropCounter(
            "capture_same_request",
            "recalltrace: %d request(s) were traced by two instrumentors of different "
            "conventions (roots overlapping in time, same service, same question): each is "
            "stored once, from the spans of the first of " + ", ".join(CONVENTIONS) + " (said "
            "once)",
        )
        # Requests offered lately, per (service, question): [convention, start, end, paired].
        self._recent: OrderedDict[tuple[str | None, str], list[list[Any]]] = OrderedDict()
        self._recent_count = 0
        self._lock = _threads.Lock()
        self.conventions: set[str] = set()
        """The conventions of the request roots seen (two or more: two instrumentors)."""

    def finish_traces(self, traces: Iterable[Iterable[SpanView]]) -> int:
        """The requests in the spans of each trace (each span whose parent is not among them
        is the top of a subtree), offered to the writer; returns how many were offered. A span
        that arrived more than once counts once."""
        candidates: list[Candidate] = []
        for spans in traces:
            unique, repeated = unique_spans(spans)
            if repeated:
                self.duplicates.add(repeated)
            ids = {view.span_id for view in unique}
            for top in unique:
                if top.parent_id not in ids:
                    candidates.extend(self.requests_in(top, unique))
        return self.offer_all(candidates)

    def finish_trace(self, spans: Iterable[SpanView]) -> int:
        """:meth:`finish_traces` of one trace."""
        return self.finish_traces([spans])

    def finish(self, top: SpanView, spans: Iterable[SpanView]) -> int:
        """The requests in the subtree of ``top`` (``spans`` holds it), offered to the writer;
        returns how many were offered."""
        return self.offer_all(self.requests_in(top, spans))

    def requests_in(self, top: SpanView, spans: Iterable[SpanView]) -> list[Candidate]:
        """The RAG requests in the subtree of ``top``, each with the children index of its
        spans (what is not a request is counted with its reason)."""
        children = children_index(spans)
        roots, stray = find_requests(top, children)
        if stray:
            self.outside.add(len(stray))
        found: list[Candidate] = []
        for root in roots:
            retrieves, decorated = _scan(root, children)
            if decorated:
                continue  # the decorated @rag request inside made its own record
            if not retrieves:
                self.no_retrieval.add()
                continue
            found.append((root, children))
        return found

    def offer_all(self, candidates: list[Candidate]) -> int:
        """Offer each request once: of the requests that are one request seen by two
        instrumentors of different conventions, the preferred convention's; returns how many
        were offered."""
        kept = self.one_per_request(candidates)
        for root, children in kept:
            self.offer(root, children)
        return len(kept)

    def one_per_request(self, candidates: list[Candidate]) -> list[Candidate]:
        """``candidates`` without those that another convention's request (among them, or
        offered lately) already stands for. Two requests are one when their conventions
        differ, they come from the same service, their roots overlap in time and carry the same
        question; each request stands for at most one of each other convention, the pairs
        closest in start and end time first, so that requests running at the same time stay
        distinct. The preferred convention's requests are taken first (see CONVENTIONS)."""
        if not candidates:
            return candidates
        kept: list[Candidate] = []
        groups: dict[str, list[tuple[tuple[str | None, str], SpanView, Any]]] = {}
        for root, children in candidates:
            convention = convention_of(root)
            question = root_question(root) if convention in CONVENTIONS else None
            if not question or not question.strip():
                kept.append((root, children))
                continue
            key = (root.service, " ".join(question.split()).casefold())
            groups.setdefault(convention, []).append((key, root, children))
        same = 0
        with self._lock:
            for convention in CONVENTIONS:
                group = groups.get(convention)
                if not group:
                    continue
                self.conventions.add(convention)
                pairs = []
                for index, (key, root, _) in enumerate(group):
                    for entry in self._recent.get(key, ()):
                        other, start, end, paired = entry
                        if paired or other == convention:
                            continue
                        if min(end, root.end) < max(start, root.start):
                            continue  # no overlap in time
                        distance = abs(start - root.start) + abs(end - root.end)
                        pairs.append((distance, index, entry))
                pairs.sort(key=lambda pair: (pair[0], pair[1]))
                matched: set[int] = set()
                for _, index, entry in pairs:
                    if index in matched or entry[3]:
                        continue
                    entry[3] = True
                    matched.add(index)
                same += len(matched)
                for index, (key, root, children) in enumerate(group):
                    if index in matched:
                        continue
                    self._remember_request(key, [convention, root.start, root.end, False])
                    kept.append((root, children))
        if same:
            self.same_request.add(same)
        return kept

    def _remember_request(self, key: tuple[str | None, str], entry: list[Any]) -> None:
        entries = self._recent.setdefault(key, [])
        self._recent.move_to_end(key)
        # A request that ended long before this one started overlaps none still to come
        # (a question asked over and over keeps a short list).
        horizon = entry[1] - _PAIR_HORIZON_NS
        if entries and entries[0][2] < horizon:
            kept = [other for other in entries if other[2] >= horizon]
            self._recent_count -= len(entries) - len(kept)
            entries[:] = kept
        entries.append(entry)
        self._recent_count += 1
        while self._recent_count > _REMEMBER_REQUESTS:
            _, forgotten = self._recent.popitem(last=False)
            self._recent_count -= len(forgotten)

    def offer(self, root: SpanView, children: Mapping[int | None, list[SpanView]]) -> bool:
        """Hand the request rooted at ``root`` to the writer (sampled like a decorated one)."""
        runtime = runtime_now()
        if not runtime.enabled:
            return False
        if not _first_offer(root):
            self.duplicates.add()
            return False
        record_id = request_record_id(root)
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
        return bool(runtime.writer.emit(state))


Candidate = tuple[SpanView, Mapping[int | None, list[SpanView]]]
# Requests an assembler remembers to recognise the same request from another convention, and
# how long after its end (nanoseconds) a request is kept for that.
_REMEMBER_REQUESTS = 4096
_PAIR_HORIZON_NS = 300 * 10**9


# The request roots offered lately in this process, by their identity (span_key): one that
# arrives again (an export retried after a lost response, a second SpanCapture on the same
# provider) is not offered twice. Past the bound, storage's idempotent writes on the record id
# (request_record_id) absorb the repeat.
_REMEMBER = 20_000
_offered: OrderedDict[tuple[int, int, int], None] = OrderedDict()
_offered_lock = _threads.Lock()


def _first_offer(root: SpanView) -> bool:
    """Whether the request rooted at ``root`` is offered for the first time (noting it)."""
    key = span_key(root)
    with _offered_lock:
        if key in _offered:
            return False
        _offered[key] = None
        if len(_offered) > _REMEMBER:
            _offered.popitem(last=False)
    return True


def span_key(view: SpanView) -> tuple[int, int, int]:
    """What makes a span the same span when it arrives again: its trace id, its span id and
    its start time (a process that seeded ``random`` draws the same ids again for another
    span, which starts at another time)."""
    return view.trace_id, view.span_id, view.start


def unique_spans(spans: Iterable[SpanView]) -> tuple[list[SpanView], int]:
    """``spans`` with each span once (the first copy), and how many repeats were left out."""
    seen: set[tuple[int, int, int]] = set()
    kept: list[SpanView] = []
    repeated = 0
    for view in spans:
        key = span_key(view)
        if key in seen:
            repeated += 1
        else:
            seen.add(key)
            kept.append(view)
    return kept, repeated


def request_record_id(root: SpanView) -> int:
    """The record id of the request rooted at ``root``: the same for every copy of the root
    span (storage writes are idempotent on it), another for any other span."""
    digest = hashlib.blake2b(
        b"%d:%d:%d" % span_key(root), digest_size=16, person=b"recalltrace-req"
    ).digest()
    return int.from_bytes(digest, "big") or 1


_modules: dict[str, Any] = {}


def runtime_now() -> Any:
    runtime_module = _modules.get("runtime")
    if runtime_module is None:
        from recalltrace.tracer import _runtime

        runtime_module = _modules["runtime"] = _runtime
    return runtime_module.current or runtime_module.get()


def merge_into_state(state: Any, parts: RequestParts) -> None:
    """Add what the instrumentors' spans of a decorated request saw to its state."""
    if not getattr(state, "sampled", False) or state.closed:
        return
    state.contexts.extend(parts.contexts)
    state.generations.extend(parts.generations)
    state.notes.extend(parts.notes)


def loaded_runtime() -> Any:
    """The current runtime when the runtime module is loaded already, else None (it is never
    loaded here)."""
    runtime_module = _modules.get("runtime")
    return runtime_module.current if runtime_module is not None else None


def _scan(root: SpanView, children: Mapping[int | None, list[SpanView]]) -> tuple[bool, bool]:
    """Whether the request under ``root`` holds a retrieval (or reranker) span, and whether it
    holds a decorated ``@rag`` request (whose record the decorator made)."""
    retrieves = False
    stack = [root]
    while stack:
        span = stack.pop()
        if span.scope == RECALLTRACE_SCOPE and span.attributes.get(SPAN_KIND) == "CHAIN":
            return retrieves, True
        if span is not root and role_of(span) in (RETRIEVER, RERANKER):
            retrieves = True
        stack.extend(children.get(span.span_id, ()))
    return retrieves, False
