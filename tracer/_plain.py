"""A finished trace as plain values, for a storage process to assemble into its record.

With ``storage_process=True`` the application's interpreter only reads what the request handed
over (:func:`~recalltrace.tracer._reader.read_values`: application objects within the reader's
budget); the record itself (texts cut to ``max_text_length``, documents with their notes,
metadata made JSON-safe, scrubbing) is assembled by the storage process, off the GIL the
application's requests need. :func:`plain_trace` takes a read state apart into values ``marshal``
carries exactly (strings, numbers, booleans, ``None`` in lists, tuples and dicts with string
keys, each of exactly those types), and :func:`assemble_plain` gives the record
:func:`~recalltrace.tracer._state.assemble_record` would have given for the state. A state holding
anything else (a ``str`` subclass, a NumPy number a retriever returned as a score) is assembled
where it was read, as before; such values are never sent in a form that would change them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recalltrace.tracer._extract import Doc, UnreadableDoc, Usage
from recalltrace.tracer._reader import is_plain
from recalltrace.tracer._state import LEFT_OUT_ID, TraceState, assemble_record

if TYPE_CHECKING:
    from recalltrace.storage.records import ReferenceUpdate, TraceRecord
    from recalltrace.tracer._scrub import Scrubber

_LEAVES = frozenset({str, int, float, bool, type(None)})

# The positions of a plain trace's values.
(
    _ID,
    _OTEL_TRACE,
    _OTEL_SPAN,
    _APP,
    _SERVICE,
    _START,
    _DURATION,
    _ERROR,
    _INPUT,
    _RESPONSE,
    _CONTEXTS,
    _GENERATIONS,
    _REFERENCE,
    _REFERENCE_CONTEXTS,
    _REFERENCE_IDS,
    _METADATA,
    _NOTES,
    _RELEASE,
    _ENVIRONMENT,
    _USER,
    _SESSION,
    _TAGS,
) = range(22)
_POOL = 22  # a pool merged in late, when there is one


@dataclass(frozen=True, slots=True)
class AssemblyOptions:
    """What record assembly takes besides the state: the tracer's ``max_text_length``, and the
    release and environment of the process, for requests that set none."""

    max_text_length: int | None
    release: str | None
    environment: str | None


class PlainTrace:
    """A finished, read trace as plain values (see the module's documentation). The writer
    holds it as it holds a record: by ``trace_id`` (32 hex digits) and ``app_name``, and a
    late reference merges into it as into the state it came from."""

    __slots__ = ("app_name", "trace_id", "values")

    def __init__(self, trace_id: str, app_name: str, values: list[Any]) -> None:
        self.trace_id = trace_id
        self.app_name = app_name
        self.values = values

    def merge_reference(self, update: ReferenceUpdate) -> None:
        """Take the fields ``update`` sets (as :meth:`TraceState.merge_reference`)."""
        if update.reference is not None:
            self.values[_REFERENCE] = update.reference
        if update.reference_contexts is not None:
            self.values[_REFERENCE_CONTEXTS] = list(update.reference_contexts)
        if update.reference_context_ids is not None:
            self.values[_REFERENCE_IDS] = list(update.reference_context_ids)
        if update.pool_contexts is not None:
            # A pool rides after the fixed values (assemble_plain takes it back).
            del self.values[_POOL:]
            self.values.append((update.pool_contexts, update.pool_source))

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlainTrace, (self.trace_id, self.app_name, self.values))


def plain_trace(state: TraceState) -> PlainTrace | None:
    """``state`` (read by ``read_values``) as a :class:`PlainTrace`; ``None`` when a value in it
    is not exactly plain (it is then assembled where it is)."""
    contexts: list[tuple[Any, ...]] = []
    for doc in state.contexts:
        kind = type(doc)
        if kind is not Doc and kind is not UnreadableDoc:
            return None
        content, doc_id, score, metadata = doc
        if (
            type(content) not in _LEAVES
            or type(doc_id) not in _LEAVES
            or type(score) not in _LEAVES
            or (metadata and not is_plain(metadata))
        ):
            return None
        if kind is Doc:
            contexts.append((content, doc_id, score, metadata))
        else:
            contexts.append((content, doc_id, score, metadata, doc.error))
    generations = []
    for text, model, usage in state.generations:
        if type(text) not in _LEAVES or type(model) not in _LEAVES:
            return None
        counts = None if usage is None else tuple(usage)
        if counts is not None and not is_plain(counts):
            return None
        generations.append((text, model, counts))
    response = state.response
    if response is None and state.response_chunks is not None:
        try:
            response = "".join(state.response_chunks)
        except TypeError:
            return None
    ids = state.reference_context_ids
    if type(ids) is list and LEFT_OUT_ID in ids:
        ids = [item for item in ids if item is not LEFT_OUT_ID]
    values = [
        state.trace_id,
        state.otel_trace_id,
        state.otel_span_id,
        state.app_name,
        state.service_name,
        state.start_wall_ns,
        state.duration_ms,
        state.error,
        state.user_input,
        response,
        contexts,
        generations,
        state.reference,
        state.reference_contexts,
        ids,
        state.metadata,
        state.notes,
        state.release,
        state.environment,
        state.user_id,
        state.session_id,
        state.tags,
    ]
    for index in _CHECKED:
        value = values[index]
        if type(value) not in _LEAVES and not is_plain(value):
            return None
    if state.pool is not None:
        values.append(state.pool)  # documents made by the pool's thread (ContextRecord)
    return PlainTrace(state.hex_id(), state.app_name, values)


# The values plain_trace takes as they are: checked to be exactly plain (the others are checked
# as they are taken apart).
_CHECKED = tuple(sorted(set(range(22)) - {_CONTEXTS, _GENERATIONS}))


def assemble_plain(
    values: list[Any], scrubber: Scrubber | None, options: AssemblyOptions
) -> TraceRecord:
    """The record of a plain trace's ``values``: what ``assemble_record`` makes of the state
    they were taken from (scrubbed with ``scrubber``, when given)."""
    state = TraceState(
        values[_ID],
        values[_APP],
        True,
        values[_START],
        0,
        values[_OTEL_TRACE],
        values[_OTEL_SPAN],
    )
    state.service_name = values[_SERVICE]
    state.duration_ms = values[_DURATION]
    state.error = values[_ERROR]
    state.closed = True
    state.user_input = values[_INPUT]
    state.response = values[_RESPONSE]
    state.contexts = [_document(item) for item in values[_CONTEXTS]]
    state.generations = [
        (text, model, None if usage is None else Usage(*usage))
        for text, model, usage in values[_GENERATIONS]
    ]
    state.reference = values[_REFERENCE]
    state.reference_contexts = values[_REFERENCE_CONTEXTS]
    state.reference_context_ids = values[_REFERENCE_IDS]
    state.metadata = values[_METADATA]
    state.notes = values[_NOTES]
    state.release = values[_RELEASE]
    state.environment = values[_ENVIRONMENT]
    state.user_id = values[_USER]
    state.session_id = values[_SESSION]
    state.tags = values[_TAGS]
    if len(values) > _POOL:
        state.pool = values[_POOL]
    return assemble_record(
        state,
        scrubber,
        options.max_text_length,
        release=options.release,
        environment=options.environment,
    )


def _document(item: tuple[Any, ...]) -> Doc:
    if len(item) == 4:
        return Doc(*item)
    doc = UnreadableDoc(*item[:4])
    doc.error = item[4]
    return doc
