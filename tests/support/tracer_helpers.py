"""Helpers for the tracer tests: sinks implementing the tracer's own ``TraceSink`` interface,
and a fixture that configures the tracer with an in-memory span exporter and sink."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import recalltrace
from recalltrace.storage.contracts import TraceNotFound
from recalltrace.storage.records import ReferenceUpdate, TraceRecord
from recalltrace.testing import MemorySink

__all__ = ["FileSink", "FlakySink", "MemorySink", "Traced", "dropped", "make_traced"]


class FlakySink(MemorySink):
    """Fails while ``down`` is set, like a database that is unreachable."""

    def __init__(self, down: bool = True) -> None:
        super().__init__()
        self.down = down
        self.failures = 0

    def write_traces(self, records: Sequence[TraceRecord]) -> None:
        if self.down:
            self.failures += 1
            raise ConnectionError("database unreachable")
        super().write_traces(records)

    def attach_reference(self, update: ReferenceUpdate) -> int:
        if self.down:
            self.failures += 1
            raise ConnectionError("database unreachable")
        return super().attach_reference(update)


class FileSink:
    """Appends one JSON line per record to a file (visible across fork and subprocesses)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write_traces(self, records: Sequence[TraceRecord]) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            for record in records:
                line = {
                    "trace_id": record.trace_id,
                    "app_name": record.app_name,
                    "user_input": record.user_input,
                    "response": record.response,
                    "contexts": [c.content for c in record.retrieved_contexts],
                }
                out.write(json.dumps(line) + "\n")

    def attach_reference(self, update: ReferenceUpdate) -> int:
        raise TraceNotFound(update.trace_id)

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]


@dataclass
class Traced:
    """A configured tracer with its in-memory exporter, sink and metric reader."""

    sink: MemorySink
    exporter: InMemorySpanExporter
    provider: TracerProvider
    metrics: InMemoryMetricReader
    config: recalltrace.TracerConfig
    extra: dict[str, Any] = field(default_factory=dict)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        spans = list(self.exporter.get_finished_spans())
        return [s for s in spans if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        (found,) = self.spans(name)
        return found

    def records(self, timeout: float = 5.0) -> list[TraceRecord]:
        assert recalltrace.flush(timeout), "flush timed out"
        return list(self.sink.records)

    def record(self, timeout: float = 5.0) -> TraceRecord:
        (found,) = self.records(timeout)
        return found

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        data = self.metrics.get_metrics_data()
        points: list[tuple[dict[str, Any], float]] = []
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            points.append((dict(point.attributes or {}), point.value))
        return points


def make_traced(
    sink: MemorySink | None = None, *, open_storage: bool = False, **options: Any
) -> Traced:
    """Configure the tracer for a test: private TracerProvider, in-memory everything
    (``open_storage``: let the tracer open storage itself, from ``database_url``)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    sink = sink if sink is not None else MemorySink()
    settings: dict[str, Any] = {
        "tracer_provider": provider,
        "meter_provider": meter_provider,
        "sink": sink,
        "service_name": "test-service",
        "flush_interval": 0.05,
        "shutdown_timeout": 2.0,
        "retry_backoff": 0.01,
        "reference_wait": 2.0,
    }
    if open_storage:
        del settings["sink"]
    settings.update(options)
    config = recalltrace.configure(**settings)
    return Traced(sink, exporter, provider, reader, config)


@recalltrace.rag("request")
def in_request(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` inside a request (a ``@rag`` root), so that what it captures is recorded."""
    return fn(*args, **kwargs)


def traced_session() -> Iterator[Traced]:
    """Body of the ``traced`` fixture of the tracer test modules: the tracer configured with
    in-memory sink and exporter, shut down afterwards."""
    state = make_traced()
    yield state
    recalltrace.shutdown(2.0)


def dropped(reason: str | None = None) -> int:
    """Records dropped so far in this process (of one reason, or all)."""
    ledger = recalltrace.ledger()
    counts = (ledger.dropped, ledger.other_dropped)
    if reason is None:
        return sum(sum(c.values()) for c in counts)
    return sum(c.get(reason, 0) for c in counts)


class Passage:
    """A document object of the application's own kind (LangChain-like ``page_content`` and
    ``metadata`` properties); the one numbered ``bad`` raises when its text is read."""

    def __init__(self, i: int, bad: int) -> None:
        self.i = i
        self.bad = bad

    @property
    def page_content(self) -> str:
        if self.i == self.bad:
            raise RuntimeError("lazy load failed")
        return f"text {self.i}"

    @property
    def metadata(self) -> dict[str, Any]:
        return {"id": f"doc-{self.i}"}
