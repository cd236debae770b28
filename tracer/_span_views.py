"""Spans as :class:`SpanView` objects, the one shape request finding reads: from the SDK's
ended spans (span capture, in process) and from OTLP/HTTP export requests (``recalltrace
collect``), with the decoding and encoding of those requests and their responses.

The OTLP protobuf classes are imported on first use, not with this module.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from recalltrace.tracer._capture_build import SpanView, resource_labels

OTLP_JSON = "application/json"
"""The content type of an OTLP/JSON body (any other is read as protobuf)."""

# -- SDK spans ----------------------------------------------------------------------------------

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


def sdk_span_view(span: Any) -> SpanView:
    """A :class:`SpanView` of an SDK ``ReadableSpan`` (its fields read directly: the public
    properties copy the attributes and events)."""
    try:
        context, parent = span._context, span._parent
    except AttributeError:
        context, parent = span.get_span_context(), span.parent
    view = SpanView(
        "",
        context.trace_id,
        context.span_id,
        parent.span_id if parent is not None else None,
        0,
        0,
        _attributes_of(span),
    )
    _read_rest(view, span)
    return view


def ended_span_view(span: Any) -> SpanView:
    """A :class:`SpanView` of an ended span, for span capture: what the application's thread
    needs when the span ends (its ids and attributes) is read at once, the rest (name, times,
    events, status, resource and scope labels) on first use, on the writer thread. An ended SDK
    span no longer changes (the SDK ignores every change after ``end``), so reading it later
    reads the same values. A span of another implementation is read at once."""
    try:
        context, parent = span._context, span._parent
    except AttributeError:
        return sdk_span_view(span)
    return _EndedSpanView(span, context, parent)


def _attributes_of(span: Any) -> Any:
    try:
        attributes = span._attributes
    except AttributeError:
        attributes = span.attributes
    # An ended SDK span's attributes no longer change: their plain dict is read from here on
    # (a BoundedAttributes lookup is a Python call; a dict's is not).
    attributes = getattr(attributes, "_dict", attributes)
    return attributes if attributes is not None else {}


def _read_rest(view: SpanView, span: Any) -> None:
    """Set every field of ``view`` but its ids and attributes from ``span``."""
    try:
        events = span._events
        status = span._status
        resource = span._resource
        scope = span._instrumentation_scope
        start, end = span._start_time, span._end_time
    except AttributeError:
        events = span.events
        status = span.status
        resource = getattr(span, "resource", None)
        scope = span.instrumentation_scope
        start, end = span.start_time, span.end_time
    view.name = span.name
    view.start = start or 0
    view.end = end or 0
    view.events = [(event.name, event.attributes or {}) for event in events] if events else ()
    view.error = status is not None and status.status_code.value == 2
    view.service, view.release, view.environment = _labels_of(resource)
    view.scope = scope.name if scope is not None else ""


_LATER = frozenset(
    {"name", "start", "end", "events", "error", "service", "scope", "release", "environment"}
)
"""The fields of an :class:`_EndedSpanView` read on first use."""


class _EndedSpanView(SpanView):
    """See :func:`ended_span_view`."""

    __slots__ = ("_span",)

    def __init__(self, span: Any, context: Any, parent: Any) -> None:
        self._span = span
        self.trace_id = context.trace_id
        self.span_id = context.span_id
        self.parent_id = (parent.span_id if parent is not None else None) or None
        self.attributes = _attributes_of(span)
        self.role = -1

    def __getattr__(self, name: str) -> Any:
        # Called only for a field not set yet: all of them are read at once.
        if name not in _LATER:
            raise AttributeError(name)
        _read_rest(self, self._span)
        return object.__getattribute__(self, name)


# -- OTLP export requests -----------------------------------------------------------------------


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(any_value, kind)
    if kind == "array_value":
        return tuple(_value(item) for item in value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.values}
    return value


def _attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


class Rejected(Exception):
    """A span that cannot be read."""


def span_views(request: Any) -> tuple[list[SpanView], int, str]:
    """The spans of an ``ExportTraceServiceRequest`` as views; the rejected count and why."""
    views = []
    rejected = 0
    reason = ""
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service, release, environment = resource_labels(resource)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    rejected += 1
                    reason = "a span's trace_id must be 16 bytes and its span_id 8 bytes"
                    continue
                parent = span.parent_span_id
                if parent and len(parent) != 8:
                    rejected += 1
                    reason = "a span's parent_span_id must be empty or 8 bytes"
                    continue
                views.append(
                    SpanView(
                        span.name,
                        int.from_bytes(span.trace_id, "big"),
                        int.from_bytes(span.span_id, "big"),
                        int.from_bytes(parent, "big") if parent else None,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        _attributes(span.attributes),
                        [(event.name, _attributes(event.attributes)) for event in span.events],
                        span.status.code == 2,
                        service,
                        scope,
                        release,
                        environment,
                    )
                )
    return views, rejected, reason


_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _hex_ids_to_base64(value: Any) -> Any:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping reads bytes as base64."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _ID_FIELDS and isinstance(item, str):
                try:
                    item = base64.b64encode(bytes.fromhex(item)).decode("ascii")
                except ValueError:
                    raise Rejected(f"{key} {item!r} is not hex") from None
            else:
                item = _hex_ids_to_base64(item)
            out[key] = item
        return out
    if isinstance(value, list):
        return [_hex_ids_to_base64(item) for item in value]
    return value


def decode_request(body: bytes, content_type: str) -> Any:
    """An ``ExportTraceServiceRequest`` from an OTLP/HTTP body; ``ValueError`` naming what is
    wrong otherwise."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if content_type == OTLP_JSON:
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise ValueError(f"the body is not JSON: {exc}") from None
        try:
            return json_format.ParseDict(
                _hex_ids_to_base64(data), ExportTraceServiceRequest(), ignore_unknown_fields=True
            )
        except (json_format.ParseError, Rejected) as exc:
            raise ValueError(f"the body is not an OTLP traces request: {exc}") from None
    try:
        return ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise ValueError(f"the body is not an OTLP protobuf traces request: {exc}") from None


def encode_response(rejected: int, message: str, content_type: str) -> bytes:
    """An ``ExportTraceServiceResponse`` (with ``partial_success`` when spans were rejected)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if content_type == OTLP_JSON:
        return json.dumps(json_format.MessageToDict(response)).encode()
    return bytes(response.SerializeToString())
