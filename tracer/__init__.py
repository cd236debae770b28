"""The tracer: three decorators that turn a RAG request into OpenTelemetry spans and a stored,
scrubbed trace record for context-recall scoring. Applications use it as ``import recalltrace``
(``recalltrace.rag``, ``recalltrace.configure``, ...), which re-exports the names below.

Importing this package is cheap: OpenTelemetry is loaded on the first decorated call or on
``configure``; storage (SQLAlchemy) only on the background writer thread.
"""

from recalltrace.tracer._api import (
    configure,
    current_trace_id,
    flush,
    generation,
    ledger,
    rag,
    retrieval,
    set_attributes,
    set_reference,
    shutdown,
)
from recalltrace.tracer._capture import SpanCapture
from recalltrace.tracer._config import ScrubbingOptions, ScrubMatch, TracerConfig, TraceSink
from recalltrace.tracer._metrics import Ledger

__all__ = [
    "Ledger",
    "ScrubMatch",
    "ScrubbingOptions",
    "SpanCapture",
    "TraceSink",
    "TracerConfig",
    "configure",
    "current_trace_id",
    "flush",
    "generation",
    "ledger",
    "rag",
    "retrieval",
    "set_attributes",
    "set_reference",
    "shutdown",
]
