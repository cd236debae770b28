"""``recalltrace collect``: an OTLP/HTTP traces receiver that stores the RAG requests it sees.

``POST /v1/traces`` takes OTLP protobuf (``application/x-protobuf``) or JSON
(``application/json``), optionally gzip-compressed. The spans are grouped per trace and turned
into trace records by the same code as the in-process span processor; the records go through
the tracer's sampling, scrubbing, bounded queue and writer.

- A trace's requests are built half a second after its root span (no parent) arrived with no
  newer span, or, for a trace whose root is never sent here, after ``--trace-idle`` seconds
  without a new span.
- Back pressure: while the writer's queue is full, requests are answered ``503`` with
  ``Retry-After`` (what OTLP exporters retry) instead of being held in memory.
- Partial success: spans that cannot be read (ids of the wrong length) are rejected and counted
  in the response's ``partial_success``, with a message.
- Bound to 127.0.0.1 unless ``--listen`` says otherwise; ``--token`` (or
  ``$RECALLTRACE_COLLECT_TOKEN``) requires ``Authorization: Bearer <token>`` (else ``401``).
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import logging
import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from recalltrace.cli._args import EXIT_OK, CommandError

logger = logging.getLogger("recalltrace.collect")

TOKEN_ENV = "RECALLTRACE_COLLECT_TOKEN"
MAX_BODY = 32 * 1024 * 1024
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# Seconds a trace whose root span arrived waits for late spans (exporters send spans
# separately, and a child may arrive after its parent).
ROOT_SETTLE = 0.5


def register(sub: Any) -> None:
    """Add the ``collect`` subcommand."""
    parser = sub.add_parser(
        "collect",
        help="receive OTLP/HTTP traces and store the RAG requests in them",
        description="Receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON, gzip) and "
        "store the RAG requests they hold (OpenInference, GenAI and OpenLLMetry spans).",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:4318",
        help="address to listen on (default: 127.0.0.1:4318, loopback only; port 0 picks one)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="where records are stored (default: $RECALLTRACE_DATABASE_URL, else SQLite)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"require 'Authorization: Bearer TOKEN' (default: ${TOKEN_ENV} when set)",
    )
    parser.add_argument(
        "--app-name", default=None, help="app name of every record (default: from the spans)"
    )
    parser.add_argument(
        "--trace-idle",
        type=_positive,
        default=5.0,
        metavar="S",
        help="build a trace whose root span never arrives after S seconds without a new span "
        "(default: 5)",
    )
    parser.add_argument(
        "--max-open-traces",
        type=int,
        default=10_000,
        metavar="N",
        help="traces held while waiting for their root span; past it the oldest is dropped "
        "and counted (default: 10000)",
    )
    parser.set_defaults(handler=run_collect)


def _positive(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {raw!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {raw!r}")
    return value


def parse_listen(raw: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a pair; ``CommandError`` otherwise."""
    host, sep, port = raw.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise CommandError(f"--listen expects HOST:PORT, e.g. 127.0.0.1:4318, not {raw!r}")
    return host, int(port)


# -- OTLP to span views ---------------------------------------------------------------------------


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


def span_views(request: Any) -> tuple[list[Any], int, str]:
    """The spans of an ``ExportTraceServiceRequest`` as views; the rejected count and why."""
    from recalltrace.tracer._capture_build import SpanView, resource_labels

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

    if content_type == JSON:
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
    if content_type == JSON:
        return json.dumps(json_format.MessageToDict(response)).encode()
    return bytes(response.SerializeToString())


# -- grouping ---------------------------------------------------------------------------------


class TraceBuffer:
    """Spans waiting for their trace's root span, bounded in traces and in time."""

    def __init__(self, assembler: Any, idle: float, max_open_traces: int) -> None:
        self.assembler = assembler
        self.idle = idle
        self.max_open_traces = max_open_traces
        self._traces: dict[int, tuple[float, list[Any]]] = {}
        self._lock = threading.Lock()
        self._rooted: set[int] = set()
        self.evicted = 0
        self.requests = 0

    def add(self, views: list[Any]) -> None:
        """Buffer ``views`` (:meth:`sweep` builds the traces that are complete)."""
        evicted = 0
        now = time.monotonic()
        with self._lock:
            for view in views:
                entry = self._traces.get(view.trace_id)
                if entry is None:
                    if len(self._traces) >= self.max_open_traces:
                        del self._traces[next(iter(self._traces))]
                        evicted += 1
                    entry = (now, [])
                spans = entry[1]
                spans.append(view)
                self._traces[view.trace_id] = (now, spans)
            for view in views:
                if view.parent_id is None:
                    self._rooted.add(view.trace_id)
        self._evict(evicted)

    def _evict(self, count: int) -> None:
        if count:
            from recalltrace.tracer import _runtime

            self.evicted += count
            _runtime.stats().drop("capture_evicted", "", count)
            logger.warning(
                "recalltrace collect: %d trace(s) pushed out by --max-open-traces before their "
                "root span arrived: not stored",
                count,
            )

    def sweep(self, everything: bool = False) -> None:
        """Build the traces idle for ``idle`` seconds (all of them with ``everything``) from
        the spans that arrived: each span whose parent never came is a top."""
        now = time.monotonic()
        limit = now - self.idle
        settled = now - min(ROOT_SETTLE, self.idle)
        with self._lock:
            due = [
                trace_id
                for trace_id, (touched, _) in self._traces.items()
                if everything or touched < limit or (trace_id in self._rooted and touched < settled)
            ]
            taken = [self._traces.pop(trace_id)[1] for trace_id in due]
            self._rooted.difference_update(due)
        self.requests += self.assembler.finish_traces(taken)


# -- server -----------------------------------------------------------------------------------


class Collector:
    """The receiver's state: the trace buffer, the writer's bound, the token."""

    def __init__(self, buffer: TraceBuffer, token: str | None) -> None:
        from recalltrace.tracer import _runtime

        self.buffer = buffer
        self.token = token
        self.runtime = _runtime.get()
        self.received = 0
        self.rejected = 0
        self.refused = 0

    def queue_full(self) -> bool:
        runtime = self.runtime
        return bool(runtime.writer.queue_size() >= runtime.config.max_queue_size)


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "recalltrace-collect"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args)

        def _reply(
            self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
            body = json.dumps({"code": status, "message": message}).encode()
            self._reply(status, body, JSON, headers)

        def do_POST(self) -> None:
            length_header = self.headers.get("Content-Length")
            if self.path.split("?")[0] != "/v1/traces":
                self._drain(length_header)
                self._error(404, "only POST /v1/traces is served")
                return
            if collector.token is not None:
                given = self.headers.get("Authorization", "")
                expected = f"Bearer {collector.token}"
                if not hmac.compare_digest(given.encode(), expected.encode()):
                    self._drain(length_header)
                    self._error(401, "missing or wrong bearer token")
                    return
            if collector.queue_full():
                collector.refused += 1
                self._drain(length_header)
                self._error(503, "the record queue is full; retry later", {"Retry-After": "2"})
                return
            chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
            if chunked:
                try:
                    body = _read_chunked(self.rfile)
                except ValueError as exc:
                    self._error(413 if "larger" in str(exc) else 400, str(exc))
                    self.close_connection = True
                    return
            else:
                if length_header is None or not length_header.isdigit():
                    self._error(411, "a Content-Length or a chunked body is required")
                    self.close_connection = True
                    return
                length = int(length_header)
                if length > MAX_BODY:
                    self._error(413, f"the body is larger than {MAX_BODY} bytes")
                    self.close_connection = True
                    return
                body = self.rfile.read(length)
            content_type = (self.headers.get("Content-Type") or PROTOBUF).split(";")[0].strip()
            if content_type not in (PROTOBUF, JSON):
                self._error(415, f"Content-Type must be {PROTOBUF} or {JSON}")
                return
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            try:
                if encoding == "gzip":
                    body = _gunzip(body)
                elif encoding not in ("", "identity"):
                    self._error(415, f"Content-Encoding {encoding!r} is not supported (use gzip)")
                    return
                request = decode_request(body, content_type)
            except ValueError as exc:
                self._error(400, str(exc))
                return
            views, rejected, reason = span_views(request)
            collector.received += len(views)
            collector.rejected += rejected
            collector.buffer.add(views)
            self._reply(200, encode_response(rejected, reason, content_type), content_type)

        def _drain(self, length_header: str | None) -> None:
            if length_header is not None and length_header.isdigit():
                length = int(length_header)
                if length <= MAX_BODY:
                    self.rfile.read(length)
                    return
            self.close_connection = True

    return Handler


def _read_chunked(stream: Any) -> bytes:
    """A ``Transfer-Encoding: chunked`` body, at most ``MAX_BODY`` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        line = stream.readline(1026)
        try:
            length = int(line.split(b";")[0].strip(), 16)
        except ValueError:
            raise ValueError("the chunked body is malformed") from None
        if length == 0:
            while stream.readline(1026) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        size += length
        if size > MAX_BODY:
            raise ValueError(f"the body is larger than {MAX_BODY} bytes")
        parts.append(stream.read(length))
        stream.readline(3)


def _gunzip(body: bytes) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = decompressor.decompress(body, MAX_BODY)
    except zlib.error as exc:
        raise ValueError(f"the gzip body cannot be read: {exc}") from None
    if decompressor.unconsumed_tail:
        raise ValueError(f"the body is larger than {MAX_BODY} bytes once decompressed")
    return data


def serve(
    host: str,
    port: int,
    *,
    token: str | None = None,
    app_name: str | None = None,
    trace_idle: float = 5.0,
    max_open_traces: int = 10_000,
) -> tuple[ThreadingHTTPServer, Collector]:
    """Start the receiver on a daemon thread (the tracer must be configured); returns the
    server (``server_address`` holds the port) and its state."""
    from recalltrace.tracer._capture import RequestAssembler

    buffer = TraceBuffer(RequestAssembler(app_name), trace_idle, max_open_traces)
    collector = Collector(buffer, token)
    server = ThreadingHTTPServer((host, port), _handler(collector))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="recalltrace-collect", daemon=True).start()
    return server, collector


def run_collect(args: argparse.Namespace) -> int:
    """Run the receiver until SIGTERM or SIGINT, then build what is buffered and drain."""
    import recalltrace

    host, port = parse_listen(args.listen)
    if args.max_open_traces < 1:
        raise CommandError("--max-open-traces must be at least 1")
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)
    from opentelemetry.sdk.trace import TracerProvider

    recalltrace.configure(
        database_url=args.database_url,
        tracer_provider=TracerProvider(),
        handle_signals=False,
        auto_migrate=False,
    )
    try:
        server, collector = serve(
            host,
            port,
            token=token,
            app_name=args.app_name,
            trace_idle=args.trace_idle,
            max_open_traces=args.max_open_traces,
        )
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    where = "" if token else " (no token: anyone who can reach it may send)"
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        where = " (not loopback and no token: anyone on the network may send)"
    print(f"READY http://{bound_host}:{bound_port}/v1/traces{where}", flush=True)
    while not stop.wait(0.5):
        collector.buffer.sweep()
    server.shutdown()
    collector.buffer.sweep(everything=True)
    done = recalltrace.shutdown()
    print(
        f"collect: {collector.received} span(s) received, {collector.rejected} rejected, "
        f"{collector.buffer.requests} request(s) found, {collector.refused} export(s) refused "
        f"while the queue was full, {collector.buffer.evicted} trace(s) evicted",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_OK if done else 1
