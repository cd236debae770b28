"""The OTLP exporters the standard ``OTEL_*`` variables ask for.

``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal ``OTEL_EXPORTER_OTLP_{SIGNAL}_ENDPOINT``)
alone turns OTLP export on; ``OTEL_{SIGNAL}_EXPORTER`` decides when it is set.
``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal variable) picks ``http/protobuf``, the
default, or ``grpc``, whose exporter comes with the ``recalltrace[grpc]`` extra. Anything that
cannot be honoured raises ``ValueError`` with one line saying what to do, at start, instead of
spans or metrics going nowhere.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Literal

Signal = Literal["traces", "metrics", "logs"]

_CLASSES = {
    "traces": "OTLPSpanExporter",
    "metrics": "OTLPMetricExporter",
    "logs": "OTLPLogExporter",
}
_MODULES = {
    "http/protobuf": {
        "traces": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "metrics": "opentelemetry.exporter.otlp.proto.http.metric_exporter",
        "logs": "opentelemetry.exporter.otlp.proto.http._log_exporter",
    },
    "grpc": {
        "traces": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "metrics": "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        "logs": "opentelemetry.exporter.otlp.proto.grpc._log_exporter",
    },
}


def otlp_wanted(signal: Signal) -> bool:
    """Whether the environment asks for OTLP export of ``signal``."""
    exporter = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER")
    if exporter is not None:
        return "otlp" in {part.strip().lower() for part in exporter.split(",")}
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    )


def otlp_protocol(signal: Signal) -> str:
    """The protocol the environment names for ``signal``; ``ValueError`` for one the
    OpenTelemetry Python exporters do not speak."""
    name = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    raw = os.environ.get(name)
    if raw is None:
        name = "OTEL_EXPORTER_OTLP_PROTOCOL"
        raw = os.environ.get(name)
    protocol = (raw or "http/protobuf").strip().lower()
    if protocol not in _MODULES:
        raise ValueError(
            f"{name}={raw!r} is not supported: use http/protobuf (the default) or grpc"
        )
    return protocol


def otlp_exporter(signal: Signal) -> Any:
    """A new OTLP exporter of ``signal`` over the protocol the environment names (the
    exporter reads the endpoint, headers and timeout from the environment itself)."""
    protocol = otlp_protocol(signal)
    try:
        module = importlib.import_module(_MODULES[protocol][signal])
    except ImportError:
        if protocol == "grpc":
            raise ValueError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: "
                "the grpc extra (pip install '.[grpc]' in a checkout, or "
                "pip install opentelemetry-exporter-otlp-proto-grpc), or unset it to export over "
                "HTTP"
            ) from None
        raise
    return getattr(module, _CLASSES[signal])()


def environment_exporter(signal: str) -> Any:
    """The OTLP exporter of ``signal`` the environment asks for, or ``None`` when it asks for
    none (``ValueError`` as :func:`otlp_exporter`)."""
    if signal not in _CLASSES:
        raise ValueError(f"unknown OpenTelemetry signal {signal!r}")
    known: Signal = signal  # type: ignore[assignment]
    return otlp_exporter(known) if otlp_wanted(known) else None
