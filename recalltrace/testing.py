"""Assert on what your application traced, in your own tests, without a database.

::

    import recalltrace
    from recalltrace.testing import capture

    def test_answer_is_traced():
        with capture() as traced:
            answer("How do I reset my password?")
        (record,) = traced.records()
        assert record.user_input == "How do I reset my password?"
        assert [c.id for c in record.retrieved_contexts] == ["kb-12", "kb-7"]

:func:`capture` configures the tracer for the block with every request sampled, an
in-memory :class:`MemorySink` instead of the database and an in-memory span exporter, and
shuts it down afterwards. The records are the ones the database would get: scrubbed, with
their notes. :class:`MemorySink` on its own is a ``sink=`` for :func:`recalltrace.configure`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from recalltrace.storage.contracts import TraceNotFound
from recalltrace.storage.records import ReferenceUpdate, TraceRecord, WriteResult

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["Captured", "MemorySink", "capture"]


class MemorySink:
    """A trace sink that keeps what it is given in memory (thread-safe).

    ``records`` holds every record written, in order; writing a record whose ``trace_id`` is
    held already changes nothing, as the database does (another request under a held id is
    returned as a conflict, not kept). ``attach_reference`` updates the held record and raises
    :class:`~recalltrace.storage.TraceNotFound` for an unknown id.
    """

    def __init__(self) -> None:
        self.records: list[TraceRecord] = []
        self.batches: list[int] = []
        """Size of each batch written, in order."""
        self.references: list[ReferenceUpdate] = []
        """Every reference update applied, in order."""
        self.lock = threading.Lock()

    def write_traces(self, records: Sequence[TraceRecord]) -> WriteResult:
        conflicts: list[str] = []
        with self.lock:
            known = {record.trace_id: record for record in self.records}
            for record in records:
                held = known.get(record.trace_id)
                if held is None:
                    known[record.trace_id] = record
                    self.records.append(record)
                elif _identity(held) != _identity(record):
                    conflicts.append(record.trace_id)
            self.batches.append(len(records))
        return WriteResult(stored=len(records) - len(conflicts), conflicts=tuple(conflicts))

    def attach_reference(self, update: ReferenceUpdate) -> int:
        with self.lock:
            for record in self.records:
                if record.trace_id == update.trace_id:
                    if update.reference is not None:
                        record.reference = update.reference
                    if update.reference_contexts is not None:
                        record.reference_contexts = list(update.reference_contexts)
                    if update.reference_context_ids is not None:
                        record.reference_context_ids = list(update.reference_context_ids)
                    self.references.append(update)
                    return 1
        raise TraceNotFound(f"no trace is held with id {update.trace_id!r}")

    def by_id(self, trace_id: str) -> TraceRecord:
        """The held record of ``trace_id``; raises ``KeyError`` when there is none."""
        with self.lock:
            for record in self.records:
                if record.trace_id == trace_id:
                    return record
        raise KeyError(trace_id)

    def clear(self) -> None:
        """Forget every record, batch and reference held."""
        with self.lock:
            self.records.clear()
            self.batches.clear()
            self.references.clear()


class Captured:
    """What :func:`capture` saw: the records (through the real writer) and the spans."""

    def __init__(self, sink: MemorySink, exporter: InMemorySpanExporter) -> None:
        self.sink = sink
        self.exporter = exporter

    def records(self, timeout: float = 5.0) -> list[TraceRecord]:
        """Every record written so far, after waiting (up to ``timeout`` seconds) for the
        writer to hand over what it holds; raises ``TimeoutError`` if it could not."""
        import recalltrace

        if not recalltrace.flush(timeout):
            raise TimeoutError(f"the trace writer did not finish within {timeout} s")
        with self.sink.lock:
            return list(self.sink.records)

    def record(self, timeout: float = 5.0) -> TraceRecord:
        """The one record written; raises ``AssertionError`` if there are none or several."""
        found = self.records(timeout)
        if len(found) != 1:
            raise AssertionError(f"expected one traced request, got {len(found)}")
        return found[0]

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans (of one name, or all), in the order they ended."""
        return [
            span for span in self.exporter.get_finished_spans() if name is None or span.name == name
        ]


@contextmanager
def capture(**options: Any) -> Iterator[Captured]:
    """Trace the block into memory: every request sampled, nothing written to a database.

    ``options`` go to :func:`recalltrace.configure` (``service_name``, ``scrubbing``, ...);
    ``sample_rate`` defaults to 1.0 here, and ``sink`` may be a :class:`MemorySink` of your
    own. The tracer is shut down when the block ends.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import recalltrace

    sink = options.pop("sink", None) or MemorySink()
    if not isinstance(sink, MemorySink):
        raise TypeError(f"capture() records into a MemorySink, not {type(sink).__name__}")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings: dict[str, Any] = {
        "sink": sink,
        "tracer_provider": provider,
        "sample_rate": 1.0,
        "flush_interval": 0.05,
    }
    settings.update(options)
    recalltrace.configure(**settings)
    try:
        yield Captured(sink, exporter)
    finally:
        recalltrace.shutdown(5.0)
        provider.shutdown()


def _identity(record: TraceRecord) -> tuple[Any, ...]:
    return (
        record.app_name,
        record.started_at,
        record.duration_ms,
        record.otel_trace_id,
        record.otel_span_id,
    )
