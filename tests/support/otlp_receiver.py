"""A minimal OTLP/HTTP receiver for tests, built on the OpenTelemetry proto package: it accepts
``POST /v1/metrics``, ``/v1/logs`` and ``/v1/traces`` (protobuf, optionally gzip), keeps every
request decoded, and answers as a collector does."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_KINDS: dict[str, tuple[Any, Any]] = {
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
}


class OTLPReceiver:
    """Listens on 127.0.0.1 (a free port); ``endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT``
    takes. ``requests[path]`` holds the decoded requests in arrival order."""

    def __init__(self) -> None:
        self.requests: dict[str, list[Any]] = {path: [] for path in _KINDS}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                kinds = _KINDS.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if kinds is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = kinds[0]()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.requests[self.path].append(request)
                answer = kinds[1]().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def metric_points(self, name: str) -> list[list[tuple[dict[str, Any], float]]]:
        """Per metrics request, in order: the (attributes, value) points of metric ``name``
        (sums and gauges)."""
        exports = []
        with self._lock:
            requests = list(self.requests["/v1/metrics"])
        for request in requests:
            points: list[tuple[dict[str, Any], float]] = []
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name != name:
                            continue
                        data = metric.sum if metric.HasField("sum") else metric.gauge
                        for point in data.data_points:
                            value = (
                                point.as_double
                                if point.HasField("as_double")
                                else float(point.as_int)
                            )
                            points.append((attributes(point.attributes), value))
            if points:
                exports.append(points)
        return exports

    def log_records(self) -> list[Any]:
        """Every log record received, in order."""
        with self._lock:
            requests = list(self.requests["/v1/logs"])
        return [
            record
            for request in requests
            for resource in request.resource_logs
            for scope in resource.scope_logs
            for record in scope.log_records
        ]

    def spans(self) -> list[Any]:
        """Every span received, in order."""
        with self._lock:
            requests = list(self.requests["/v1/traces"])
        return [
            span
            for request in requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


class OTLPGrpcReceiver(OTLPReceiver):
    """The same over OTLP/gRPC (``grpcio``, from the ``grpc`` extra): ``endpoint`` is what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes with ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.requests = {path: [] for path in _KINDS}
        self._lock = threading.Lock()
        receiver = self

        def servicer(base: type, path: str) -> Any:
            class Servicer(base):  # type: ignore[misc, valid-type]
                def Export(self, request: Any, context: Any) -> Any:
                    with receiver._lock:
                        receiver.requests[path].append(request)
                    return _KINDS[path][1]()

            return Servicer()

        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            servicer(trace_service_pb2_grpc.TraceServiceServicer, "/v1/traces"), self._grpc
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            servicer(metrics_service_pb2_grpc.MetricsServiceServicer, "/v1/metrics"), self._grpc
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            servicer(logs_service_pb2_grpc.LogsServiceServicer, "/v1/logs"), self._grpc
        )
        self._port = self._grpc.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def __enter__(self) -> OTLPGrpcReceiver:
        self._grpc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grpc.stop(grace=None)


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP key-values as a dictionary of plain values."""
    result: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        kind = value.WhichOneof("value")
        result[kv.key] = getattr(value, kind) if kind else None
    return result
