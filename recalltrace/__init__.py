"""recalltrace: context-recall monitoring for production RAG, on OpenTelemetry.

Decorate the three functions of a RAG request; a deterministic sample of requests is stored,
scrubbed, off the request path, and scored by ``recalltrace worker``::

    import recalltrace

    recalltrace.configure(service_name="support-api", sample_rate=0.1)

    @recalltrace.rag
    def answer(question: str) -> str: ...

    @recalltrace.retrieval
    def search(query: str) -> list[dict]: ...

    @recalltrace.generation(model="gpt-4o-mini")
    def generate(prompt: str) -> str: ...

Scorers on their own: :mod:`recalltrace.scorers`. Importing this package is cheap: it loads
neither OpenTelemetry's SDK, nor SQLAlchemy, nor LiteLLM.
"""

from recalltrace.tracer import (
    ScrubbingOptions,
    ScrubMatch,
    TracerConfig,
    TraceSink,
    configure,
    current_trace_id,
    flush,
    generation,
    rag,
    retrieval,
    set_reference,
    shutdown,
)

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
