"""One variant of ``benchmarks.forked_jobs``: fork the jobs one after the other and print the
wall time of each (fork to ``waitpid``) as a JSON list.

    python -m benchmarks._forked_parent VARIANT DATABASE_URL JOBS WARMUP CONFIGURE_IN_CHILD
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

DOC = ("Retrieval-augmented generation grounds answers in retrieved passages. " * 5)[:300]
DOCS = [{"id": f"doc-{i}", "content": DOC, "score": 0.9 - i / 100} for i in range(10)]
ANSWER = "It retrieves passages first."


def plain() -> Callable[[str], Any]:
    def search(q: str) -> list[dict[str, Any]]:
        return DOCS

    def generate(q: str, docs: list[dict[str, Any]]) -> str:
        return ANSWER

    def answer(q: str) -> str:
        return generate(q, search(q))

    return answer


def by_hand() -> Callable[[str], Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")

    def search(q: str) -> list[dict[str, Any]]:
        with tracer.start_as_current_span("search") as span:
            span.set_attribute("input.value", q)
            for i, doc in enumerate(DOCS):
                span.set_attribute(f"retrieval.documents.{i}.document.id", doc["id"])
                span.set_attribute(f"retrieval.documents.{i}.document.content", doc["content"])
            return DOCS

    def generate(q: str, docs: list[dict[str, Any]]) -> str:
        with tracer.start_as_current_span("generate") as span:
            span.set_attribute("output.value", ANSWER)
            return ANSWER

    def answer(q: str) -> str:
        with tracer.start_as_current_span("answer") as span:
            span.set_attribute("input.value", q)
            return generate(q, search(q))

    return answer


def traced(url: str, variant: str) -> Callable[[str], Any]:
    import recalltrace

    recalltrace.configure(
        database_url=url,
        sample_rate=1.0,
        service_name=f"forked-{variant}",
        # "auto": left to choose, as by default.
        storage_process=None if variant == "auto" else variant == "process",
        shutdown_timeout=60,
    )

    @recalltrace.retrieval
    def search(q: str) -> list[dict[str, Any]]:
        return DOCS

    @recalltrace.generation(model="bench")
    def generate(q: str, docs: list[dict[str, Any]]) -> str:
        return ANSWER

    @recalltrace.rag("forked-job")
    def answer(q: str) -> str:
        return generate(q, search(q))

    return answer


def build(variant: str, url: str) -> Callable[[str], Any]:
    if variant == "plain":
        return plain()
    if variant == "otel":
        return by_hand()
    return traced(url, variant)


def main() -> None:
    variant, url = sys.argv[1], sys.argv[2]
    jobs, warmup, in_child = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    answer = None if in_child else build(variant, url)
    times = []
    for number in range(jobs + warmup):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            job = answer if answer is not None else build(variant, url)
            job(f"question {number}")
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if number >= warmup:
            times.append(time.perf_counter() - started)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"job {number} ended with {status}")
    print(json.dumps(times))


if __name__ == "__main__":
    main()
