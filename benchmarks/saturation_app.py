"""The FastAPI application of ``benchmarks.saturation``, run by uvicorn in its own process.

``GET /ask?q=...`` answers one RAG request: a root calling a retriever (10 documents of 300
characters with id, score and metadata, as in ``benchmarks.tracer_overhead``) and a generator.
``SATURATION_VARIANT`` chooses how it is traced:

- ``plain``: not traced;
- ``otel``: OpenTelemetry spans with the same attributes written by hand;
- ``rate0``: the recalltrace decorators at sample rate 0 (spans only);
- ``rate0.1`` / ``rate1``: the decorators at sample rate 0.1 / 1, the sampled requests stored
  in the database at ``SATURATION_DATABASE_URL`` by the tracer's writer thread;
- ``rate0.1p`` / ``rate1p``: the same, stored through a storage process
  (``storage_process=True``);
- ``rate1pn``: as ``rate1p``, the storage process 10 below the application's CPU priority
  (``storage_process_nice=10``).

Every traced variant uses one SDK provider with a batch processor and an exporter that discards
(the figures are the tracing and storing cost, not an exporter's). ``GET /flush`` waits until
what was queued is stored; ``GET /ledger`` answers the tracer's account of what it saw (after a
flush), for the benchmark to check that nothing went missing.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import recalltrace
from benchmarks.tracer_overhead import (
    DiscardingExporter,
    DiscardingSink,
    otel_answer,
    plain_answer,
    rt_answer,
)

VARIANT = os.environ.get("SATURATION_VARIANT", "plain")

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
trace.set_tracer_provider(provider)

answer: Any = plain_answer
if VARIANT == "otel":
    answer = otel_answer
elif VARIANT.startswith("rate"):
    separate = VARIANT.endswith(("p", "pn"))
    rate = float(VARIANT[len("rate") :].rstrip("pn"))
    discard = os.environ.get("SATURATION_SINK") == "discard"
    recalltrace.configure(
        tracer_provider=provider,
        database_url=None if discard else os.environ.get("SATURATION_DATABASE_URL"),
        sink=DiscardingSink() if discard else None,
        sample_rate=rate,
        storage_process=separate and not discard,
        storage_process_nice=10 if VARIANT.endswith("pn") else 0,
        service_name="saturation",
        handle_signals=True,
    )
    answer = rt_answer
elif VARIANT != "plain":
    raise SystemExit(f"unknown SATURATION_VARIANT {VARIANT!r}")

app = FastAPI()


@app.get("/ask")
def ask(q: str = "How does the tracer measure context recall in production?") -> dict[str, str]:
    return {"answer": answer(q)}


@app.get("/flush")
def flush() -> dict[str, Any]:
    """Wait until every record queued so far is stored (the benchmark calls it after each slice
    of load); answers how many were still waiting."""
    if not VARIANT.startswith("rate"):
        return {"flushed": True, "pending": 0}
    pending = recalltrace.ledger().pending
    return {"flushed": recalltrace.flush(60), "pending": pending}


@app.get("/ledger")
def ledger() -> dict[str, Any]:
    if not VARIANT.startswith("rate"):
        return {}
    recalltrace.flush(60)
    account = recalltrace.ledger()
    return {
        "seen": account.seen,
        "stored": account.stored,
        "sampled_out": account.sampled_out,
        "dropped": dict(account.dropped),
        "pending": account.pending,
    }
