"""recalltrace's tracer: three decorators that turn a RAG request into OpenTelemetry spans and a
stored, scrubbed trace record for context-recall scoring.

    import tracer

    tracer.configure(database_url="postgresql+psycopg://...", sample_rate=0.1)

    @tracer.rag
    def answer(question: str) -> str: ...

    @tracer.retrieval
    def search(query: str) -> list[dict]: ...

    @tracer.generation(model="gpt-4o-mini")
    def generate(prompt: str) -> str: ...

Importing this package is cheap: OpenTelemetry is loaded on the first decorated call or on
``configure``; storage (SQLAlchemy) only on the background writer thread.
"""

from tracer._api import (
    configure,
    current_trace_id,
    flush,
    generation,
    rag,
    retrieval,
    set_reference,
    shutdown,
)
from tracer._config import ScrubbingOptions, ScrubMatch, TracerConfig, TraceSink

__all__ = [
    "ScrubMatch",
    "ScrubbingOptions",
    "TraceSink",
    "TracerConfig",
    "configure",
    "current_trace_id",
    "flush",
    "generation",
    "rag",
    "retrieval",
    "set_reference",
    "shutdown",
]
