"""Span capture and ``recalltrace collect`` read spans through one module: an SDK span read in
process and the same span exported over OTLP (protobuf or JSON) give the same view."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from recalltrace.tracer._span_views import (
    OTLP_JSON,
    decode_request,
    encode_response,
    ended_span_view,
    sdk_span_view,
    span_views,
)

FIELDS = (
    "name",
    "trace_id",
    "span_id",
    "parent_id",
    "start",
    "end",
    "error",
    "service",
    "scope",
    "release",
    "environment",
)


def _finished_spans() -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {
                "service.name": "shop",
                "service.version": "1.2",
                "deployment.environment.name": "prod",
            }
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("an.instrumentor")
    retrieval = {
        "openinference.span.kind": "RETRIEVER",
        "retrieval.documents.0.document.content": "a text",
        "retrieval.documents.0.document.score": 0.5,
        "tag.tags": ("a", "b"),
    }
    with (
        tracer.start_as_current_span("chain", attributes={"openinference.span.kind": "CHAIN"}),
        tracer.start_as_current_span("retrieve", attributes=retrieval) as span,
    ):
        span.add_event("found", {"count": 1})
        span.set_status(Status(StatusCode.ERROR, "no"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _same(left: Any, right: Any) -> None:
    assert [getattr(left, name) for name in FIELDS] == [getattr(right, name) for name in FIELDS]
    assert dict(left.attributes) == dict(right.attributes)
    assert [(name, dict(attrs)) for name, attrs in left.events] == [
        (name, dict(attrs)) for name, attrs in right.events
    ]


@pytest.mark.parametrize("content_type", ["application/x-protobuf", OTLP_JSON])
def test_an_exported_span_reads_as_the_span_itself(content_type: str) -> None:
    spans = _finished_spans()
    message = encode_spans(spans)
    if content_type == OTLP_JSON:
        data = json_format.MessageToDict(message)
        # OTLP/JSON writes ids as hex (protobuf's JSON mapping would write base64).
        for resource in data["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64decode(span[key]).hex()
        body = json.dumps(data).encode()
    else:
        body = message.SerializeToString()
    views, rejected, reason = span_views(decode_request(body, content_type))
    assert (rejected, reason) == (0, "")
    by_id = {view.span_id: view for view in views}
    assert len(by_id) == 2
    for span in spans:
        _same(by_id[span.context.span_id], sdk_span_view(span))
    retrieve = by_id[spans[0].context.span_id]
    assert retrieve.error and retrieve.service == "shop" and retrieve.environment == "prod"


def test_an_ended_span_read_later_reads_as_read_at_once() -> None:
    # Span capture reads an ended span's ids and attributes on the application's thread and
    # the rest on first use (on the writer thread): the same view either way, every field.
    for span in _finished_spans():
        later = ended_span_view(span)
        assert (later.trace_id, later.span_id, later.parent_id) == (
            span.context.trace_id,
            span.context.span_id,
            span.parent.span_id if span.parent is not None else None,
        )
        assert later.role == -1
        _same(later, sdk_span_view(span))
        with pytest.raises(AttributeError):
            _ = later.not_a_field  # type: ignore[attr-defined]


def test_a_span_of_another_implementation_is_read_at_once() -> None:
    # Without the SDK's private fields, the public properties are read, all when it ends.
    class Other:
        def __init__(self, span: Any) -> None:
            self._inner = span

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):
                raise AttributeError(name)
            return getattr(self._inner, name)

        def get_span_context(self) -> Any:
            return self._inner.get_span_context()

    for span in _finished_spans():
        view = ended_span_view(Other(span))
        assert type(view) is type(sdk_span_view(span))
        _same(view, sdk_span_view(span))


def test_a_bad_body_is_one_line_naming_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        decode_request(b"{", OTLP_JSON)
    with pytest.raises(ValueError, match="traceId 'zz' is not hex"):
        decode_request(
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', OTLP_JSON
        )
    with pytest.raises(ValueError, match="not an OTLP protobuf traces request"):
        decode_request(b"\xff\xff\xff", "application/x-protobuf")


def test_a_span_with_bad_ids_is_rejected_and_counted() -> None:
    body = json.dumps(
        {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab", "spanId": "cd"}]}]}]}
    ).encode()
    views, rejected, reason = span_views(decode_request(body, OTLP_JSON))
    assert views == [] and rejected == 1 and "16 bytes" in reason
    response = json.loads(encode_response(rejected, reason, OTLP_JSON))
    assert response["partialSuccess"]["rejectedSpans"] == "1"
