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

import os as _os

# In a checkout the parts live beside this folder (tracer/, scorers/, storage/, migrations/) and
# are mapped into the package only when it is installed. A script run inside the checkout imports
# this folder rather than the installed package, so its parts are looked up there too.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "tracer", "__init__.py")) and _os.path.isfile(
    _os.path.join(_checkout, "pyproject.toml")
):
    __path__.append(_checkout)
del _checkout

from recalltrace._wiring import check_default_sink as _check_default_sink
from recalltrace._wiring import default_sink as _default_sink
from recalltrace._wiring import open_history, open_repository
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

_set_default_sink_factory(_default_sink, _check_default_sink)

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
    "set_attributes",
    "set_reference",
    "shutdown",
]
