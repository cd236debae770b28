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

# First: in a checkout, the parts are found beside this folder (see _checkout).
from recalltrace._checkout import checkout_root as _checkout_root

if (_root := _checkout_root()) is not None:
    __path__.append(_root)
    from recalltrace._checkout import shadowed_installation as _shadowed

    if (_other := _shadowed(_root)) is not None:
        import logging as _logging

        _logging.getLogger("recalltrace").warning(
            "recalltrace: importing the checkout at %s, not %s (a script run inside a clone "
            "imports the clone's code; run it from another folder to use the installed one)",
            _root,
            _other,
        )
from recalltrace._wiring import check_default_sink as _check_default_sink
from recalltrace._wiring import default_sink as _default_sink
from recalltrace._wiring import open_history, open_repository, run_worker
from recalltrace._wiring import warm_default_sink as _warm_default_sink
from recalltrace.tracer import (
    Ledger,
    ScrubbingOptions,
    ScrubMatch,
    SpanCapture,
    TracerConfig,
    TraceSink,
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
from recalltrace.tracer._sinks import set_default_sink_factory as _set_default_sink_factory

_set_default_sink_factory(_default_sink, _check_default_sink, _warm_default_sink)

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
    "open_history",
    "open_repository",
    "rag",
    "retrieval",
    "run_worker",
    "set_attributes",
    "set_reference",
    "shutdown",
]
