"""The in-memory state of one trace while it runs, and its assembly into a ``TraceRecord``.

The request path only appends raw values (strings, already-read documents, usage tuples) to a
``TraceState``; conversion, truncation and scrubbing happen in :func:`assemble_record`, which the
writer thread calls.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from recalltrace.storage.records import ContextRecord, ReferenceUpdate, TraceRecord
from recalltrace.tracer._extract import (
    UnreadableDoc,
    Usage,
    to_id_list,
    to_text,
    to_text_list,
)

if TYPE_CHECKING:
    from recalltrace.tracer._scrub import Scrubber


class TraceState:
    """What the decorated calls of one trace captured so far."""

    __slots__ = (
        "app_name",
        "closed",
        "contexts",
        "duration_ms",
        "environment",
        "error",
        "generations",
        "last_error",
        "metadata",
        "notes",
        "otel_span_id",
        "otel_trace_id",
        "pool",
        "reference",
        "reference_context_ids",
        "reference_contexts",
        "release",
        "response",
        "response_chunks",
        "sampled",
        "service_name",
        "session_id",
        "start_perf_ns",
        "start_wall_ns",
        "tags",
        "trace_hex",
        "trace_id",
        "user_id",
        "user_input",
    )

    def __init__(
        self,
        trace_id: int,
        app_name: str,
        sampled: bool,
        start_wall_ns: int,
        start_perf_ns: int,
        otel_trace_id: int = 0,
        otel_span_id: int = 0,
    ) -> None:
        # ``trace_id`` is the record's own id: one per request (outermost ``@rag`` call), drawn
        # from the operating system's randomness, so requests sharing an OpenTelemetry trace
        # (one application span around several requests, a propagated traceparent, a process
        # that seeded ``random``) never share it. The OpenTelemetry ids are kept for linking.
        self.trace_id = trace_id
        self.otel_trace_id = otel_trace_id
        self.otel_span_id = otel_span_id
        self.trace_hex: str | None = None
        self.app_name = app_name
        self.sampled = sampled
        self.start_wall_ns = start_wall_ns
        self.start_perf_ns = start_perf_ns
        self.duration_ms = 0.0
        self.service_name = ""
        self.error = False
        self.closed = False
        self.last_error: BaseException | None = None
        # A pool retrieved for this request (documents and the pool's name), merged in late.
        self.pool: tuple[list[ContextRecord], str | None] | None = None
        if not sampled:
            # Nothing is captured for an unsampled trace; its capture fields stay unset.
            return
        self.user_input: Any = None
        self.response: str | None = None
        self.response_chunks: list[str] | None = None
        # Documents in rank order; a retrieval's documents past what its span holds are kept
        # unread (an object with ``read()``) and read here, on the writer thread.
        self.contexts: list[Any] = []
        self.generations: list[tuple[str | None, str | None, Usage | None]] = []
        self.reference: Any = None
        self.reference_contexts: Any = None
        self.reference_context_ids: Any = None
        self.metadata: dict[str, Any] = {}
        self.notes: list[str] = []
        self.release: str | None = None
        self.environment: str | None = None
        self.user_id: str | None = None
        self.session_id: str | None = None
        self.tags: list[str] = []

    def hex_id(self) -> str:
        """The record's id as 32 lowercase hex digits."""
        if self.trace_hex is None:
            self.trace_hex = format(self.trace_id, "032x")
        return self.trace_hex

    def merge_reference(self, update: ReferenceUpdate) -> None:
        """Take the fields ``update`` sets."""
        if update.reference is not None:
            self.reference = update.reference
        if update.reference_contexts is not None:
            self.reference_contexts = update.reference_contexts
        if update.reference_context_ids is not None:
            self.reference_context_ids = update.reference_context_ids
        if update.pool_contexts is not None:
            self.pool = (update.pool_contexts, update.pool_source)


def merge_reference_into_record(record: TraceRecord, update: ReferenceUpdate) -> None:
    """Apply a late reference to a record that is assembled but not written yet."""
    if update.reference is not None:
        record.reference = update.reference
    if update.reference_contexts is not None:
        record.reference_contexts = list(update.reference_contexts)
    if update.reference_context_ids is not None:
        record.reference_context_ids = list(update.reference_context_ids)
    if update.pool_contexts is not None:
        record.pool_contexts = list(update.pool_contexts)
        record.pool_source = update.pool_source


def scrub_pool(scrubber: Scrubber, contexts: list[ContextRecord]) -> list[ContextRecord]:
    """A pool's documents with their texts and ids scrubbed, as retrieved contexts are."""
    return [
        ContextRecord(
            content=scrubber.scrub_text(c.content, f"pool_contexts[{i}].content", None),
            id=None if c.id is None else scrubber.scrub_text(c.id, f"pool_contexts[{i}].id", None),
            score=c.score,
        )
        for i, c in enumerate(contexts)
    ]


def scrub_with_pool(scrubber: Scrubber, record: TraceRecord) -> None:
    """Scrub an assembled ``record`` in place, its pool's documents included."""
    scrubber.scrub_record(record)
    if record.pool_contexts:
        record.pool_contexts = scrub_pool(scrubber, record.pool_contexts)


def scrub_reference(scrubber: Scrubber, update: ReferenceUpdate) -> ReferenceUpdate:
    """``update`` (ground truth set after its request ended) with its texts scrubbed, as the
    same fields of a record are."""

    def scrubbed(texts: list[str] | None, field: str) -> list[str] | None:
        if texts is None:
            return None
        return [scrubber.scrub_text(t, f"{field}[{i}]", None) for i, t in enumerate(texts)]

    reference = update.reference
    return ReferenceUpdate(
        trace_id=update.trace_id,
        reference=None if reference is None else scrubber.scrub_text(reference, "reference", None),
        reference_contexts=scrubbed(update.reference_contexts, "reference_contexts"),
        reference_context_ids=scrubbed(update.reference_context_ids, "reference_context_ids"),
        pool_contexts=(
            None if update.pool_contexts is None else scrub_pool(scrubber, update.pool_contexts)
        ),
        pool_source=update.pool_source,
    )


def _cut(text: str | None, limit: int | None, where: str, notes: list[str]) -> str | None:
    if text is None or limit is None or len(text) <= limit:
        return text
    notes.append(f"truncated {where} from {len(text)} to {limit} characters")
    return text[:limit]


_SCALARS = (str, int, float, bool, type(None))
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_safe(value: Any, depth: int = 0, found: list[str] | None = None, where: str = "") -> Any:
    """``value`` as JSON values (dicts with string keys, lists, strings, numbers, booleans,
    ``None``); another object becomes its printed text. With ``found``, a NaN or an infinity
    (which JSON cannot hold, and which Postgres and SQLite would store differently) becomes
    the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and its position is added to it."""
    if isinstance(value, float) and found is not None and not math.isfinite(value):
        found.append(where)
        return _NON_FINITE[repr(float(value))]
    if value is None or isinstance(value, _SCALARS):
        return value
    if type(value) is dict:
        for key, item in value.items():
            if (
                type(key) is not str
                or not isinstance(item, _SCALARS)
                or (found is not None and isinstance(item, float) and not math.isfinite(item))
            ):
                break
        else:
            return dict(value)
    if depth > 20:
        return _printed(value)
    if isinstance(value, dict):
        return {
            (name := _printed(k)): json_safe(v, depth + 1, found, f"{where}.{name}")
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, depth + 1, found, f"{where}[{i}]") for i, v in enumerate(value)]
    return _printed(value)


def _printed(value: Any) -> str:
    """``str(value)``, or a placeholder when printing it raises (a user ``__str__``, or a
    structure nested past the recursion limit)."""
    try:
        return str(value)
    except Exception as exc:
        return f"<{type(value).__name__} not printable: {type(exc).__name__}>"


def _text(value: Any, where: str, notes: list[str]) -> str | None:
    """``to_text(value)``; a value that cannot be printed is left out with a note."""
    try:
        return to_text(value)
    except Exception as exc:
        notes.append(f"{where} not captured: its value raised {type(exc).__name__} when printed")
        return None


def assemble_record(
    state: TraceState,
    scrubber: Scrubber | None,
    max_text_length: int | None,
    release: str | None = None,
    environment: str | None = None,
) -> TraceRecord:
    """Build the storage record of a finished, sampled trace (on the writer thread);
    ``release`` and ``environment`` are the process's, for requests that set none."""
    prepare = getattr(state, "prepare", None)
    if prepare is not None:
        prepare()  # a trace captured from spans reads them here, off the request path
    notes = list(state.notes)
    response = state.response
    if response is None and state.response_chunks is not None:
        response = "".join(state.response_chunks)
    if response is None:
        for text, _, _ in reversed(state.generations):
            if text is not None:
                response = text
                break
    metadata = dict(state.metadata)
    llm_calls = [
        {
            "model": model,
            "prompt_tokens": usage.prompt if usage else None,
            "completion_tokens": usage.completion if usage else None,
            "total_tokens": usage.total if usage else None,
        }
        for _, model, usage in state.generations
        if model is not None or usage is not None
    ]
    if llm_calls:
        metadata["llm"] = llm_calls
    limit = max_text_length if max_text_length is not None else -1
    contexts = []
    read: list[Any] = []
    for item in state.contexts:
        if isinstance(item, tuple):
            read.append(item)
        else:
            read.extend(item.read())
    # One pass over the documents; the notes about their shape come first, as they are read.
    failed: list[tuple[int, str]] = []
    blank: list[int] = []
    textless: list[int] = []
    non_finite: list[str] = []
    loop_notes: list[str] = []
    for index, doc in enumerate(read):
        content, doc_id, score, doc_metadata = doc
        if not content:
            if type(doc) is UnreadableDoc:
                # One left out unread (its reading did not finish) has no error: the note
                # of that is the reader's.
                if doc.error:
                    failed.append((index, doc.error))
            elif doc_id is None:
                blank.append(index)
            else:
                textless.append(index)
        elif limit >= 0 and len(content) > limit:
            content = _cut(content, limit, f"retrieved_contexts[{index}]", loop_notes) or ""
        if score is not None and not math.isfinite(score):
            non_finite.append(f"retrieved_contexts[{index}].score")
            score = None
        if doc_metadata:
            doc_metadata = json_safe(
                doc_metadata, found=non_finite, where=f"retrieved_contexts[{index}].metadata"
            )
        contexts.append(ContextRecord(content, doc_id, score, doc_metadata or {}))
    if failed:
        shown = ", ".join(f"{i} ({error})" for i, error in failed[:10])
        more = " ..." if len(failed) > 10 else ""
        plural = "s" if len(failed) > 1 else ""
        notes.append(
            f"{len(failed)} retrieved document(s) could not be read, raising when read "
            f"(position{plural} {shown}{more}); each is kept empty in its place"
        )
    if blank:
        shown = ", ".join(str(i) for i in blank[:10]) + (" ..." if len(blank) > 10 else "")
        notes.append(
            f"{len(blank)} retrieved document(s) had neither text nor an id (positions {shown}): "
            "their shape was not recognised; pass extractor= to @retrieval"
        )
    # A trace captured from spans says what its spans lacked in its own words (capture_build).
    if textless and metadata.get("captured_from") != "spans":
        shown = ", ".join(str(i) for i in textless[:10]) + (" ..." if len(textless) > 10 else "")
        notes.append(
            f"{len(textless)} retrieved document(s) had an id but no readable text (positions "
            f"{shown}): only the id-based variant can use them; if the text is elsewhere (e.g. "
            "Pinecone's metadata['text']), return it as text with extractor= on @retrieval"
        )
    notes.extend(loop_notes)
    metadata = json_safe(metadata, found=non_finite, where="metadata")
    if non_finite:
        shown = ", ".join(non_finite[:10]) + (" ..." if len(non_finite) > 10 else "")
        notes.append(
            f"{len(non_finite)} value(s) were NaN or infinite, which JSON cannot hold: stored "
            f'as the strings "NaN", "Infinity" or "-Infinity" (a score as null) at {shown}'
        )
    reference_contexts = to_text_list(state.reference_contexts)
    if reference_contexts is not None and max_text_length is not None:
        reference_contexts = [
            _cut(text, max_text_length, f"reference_contexts[{i}]", notes) or ""
            for i, text in enumerate(reference_contexts)
        ]
    record = TraceRecord(
        trace_id=state.hex_id(),
        otel_trace_id=format(state.otel_trace_id, "032x") if state.otel_trace_id else None,
        otel_span_id=format(state.otel_span_id, "016x") if state.otel_span_id else None,
        app_name=state.app_name,
        service_name=state.service_name,
        started_at=datetime.fromtimestamp(state.start_wall_ns / 1e9, tz=timezone.utc),
        duration_ms=state.duration_ms,
        user_input=_cut(
            _text(state.user_input, "user_input", notes), max_text_length, "user_input", notes
        ),
        response=_cut(response, max_text_length, "response", notes),
        retrieved_contexts=contexts,
        reference=_cut(
            _text(state.reference, "reference", notes), max_text_length, "reference", notes
        ),
        reference_contexts=reference_contexts,
        reference_context_ids=read_ids(state.reference_context_ids, notes),
        metadata=metadata,
        error=state.error,
        notes=notes,
        release=_label(state.release) or release,
        environment=_label(state.environment) or environment,
        user_id=_label(state.user_id),
        session_id=_label(state.session_id),
        tags=[tag for tag in (_label(item) for item in state.tags) if tag],
    )
    if state.pool is not None:
        record.pool_contexts, record.pool_source = list(state.pool[0]), state.pool[1]
    if scrubber is not None:
        scrub_with_pool(scrubber, record)
    return record


LEFT_OUT_ID: Any = object()
"""Marks a reference id that was left out while reading (its note is made there)."""


def read_ids(value: Any, notes: list[str]) -> list[str] | None:
    """Reference ids as text; one that cannot be printed is left out with a note."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    elif isinstance(value, (str, int)):
        items = [value]
    else:
        try:
            return to_id_list(value)
        except Exception as exc:
            notes.append(
                f"reference_context_ids not captured: reading them raised {type(exc).__name__}"
            )
            return None
    ids: list[str] = []
    for index, item in enumerate(items):
        if item is LEFT_OUT_ID:
            continue
        try:
            ids.append(item if type(item) is str else str(item))
        except Exception as exc:
            notes.append(
                f"reference_context_ids[{index}] left out: its value raised "
                f"{type(exc).__name__} when printed"
            )
    return ids


def _label(value: Any) -> str | None:
    """An attribute value as text (ids may be numbers); ``None`` for nothing."""
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)
