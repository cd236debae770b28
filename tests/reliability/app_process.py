"""A traced RAG app as a process: calls a decorated request at a steady rate and reports.

Used by the fault-injection tests and ``benchmarks/load_test.py``::

    python -m tests.reliability.app_process --database-url URL --rate 200 --seconds 10 \\
        [--ids-file ids.txt] [--max-queue-size N] [--mode recalltrace|otel]

Each request is a root calling a retriever (three documents) and a generator, decorated with
``@recalltrace.rag``/``@recalltrace.retrieval``/``@recalltrace.generation`` (``--mode otel``: the
same functions with OpenTelemetry spans and attributes set by hand, the baseline of the overhead
target). Calls follow an open-loop schedule, so a slow call does not lower the offered rate, and
each checks that the decorated function returned exactly what its body returned. With ``--ids-file``
the trace id of every request is written there. The last line printed is one JSON object: calls,
wrong results, exceptions, latency percentiles of the request path (ms), RSS samples and peak (MiB),
the tracer's counters (sampled, dropped by reason) and whether the final flush completed."""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as otel_trace

import recalltrace

DOCUMENTS = [
    {
        "id": f"kb-{index}",
        "content": f"Article {index}: to reset a password open Settings, then Security, "
        "and follow the link sent to the account's address.",
        "score": 0.9 - index / 10,
        "metadata": {"source": f"kb/{index}.md"},
    }
    for index in range(3)
]
GOLD_CONTEXTS = [str(DOCUMENTS[0]["content"])]
GOLD_IDS = ["kb-0", "kb-9"]

trace_ids: list[str] | None = None
"""Trace id of every request, in call order (only collected with ``--ids-file``)."""


def _answer_text(question: str, docs: list[dict[str, Any]], generated: str) -> str:
    return f"{question} -> {len(docs)} documents: {generated}"


# -- recalltrace --------------------------------------------------------------------------------


@recalltrace.retrieval
def search(query: str) -> list[dict[str, Any]]:
    return DOCUMENTS


@recalltrace.generation(model="test-model")
def generate(prompt: str) -> str:
    return "Open Settings > Security."


@recalltrace.rag(
    "reliability-app",
    reference_contexts_param="gold_contexts",
    reference_context_ids_param="gold_ids",
)
def answer(question: str, gold_contexts: list[str], gold_ids: list[str]) -> str:
    docs = search(question)
    if trace_ids is not None:
        trace_ids.append(recalltrace.current_trace_id() or "")
    return _answer_text(question, docs, generate(question))


# -- the same request with OpenTelemetry spans written by hand (the baseline) -------------------

_otel = otel_trace.get_tracer("reliability-baseline")


def otel_search(query: str) -> list[dict[str, Any]]:
    with _otel.start_as_current_span("search") as span:
        span.set_attribute("openinference.span.kind", "RETRIEVER")
        span.set_attribute("input.value", query)
        for index, doc in enumerate(DOCUMENTS):
            prefix = f"retrieval.documents.{index}.document."
            span.set_attribute(prefix + "id", str(doc["id"]))
            span.set_attribute(prefix + "content", str(doc["content"]))
            span.set_attribute(prefix + "score", float(doc["score"]))  # type: ignore[arg-type]
            span.set_attribute(prefix + "metadata", json.dumps(doc["metadata"]))
        return DOCUMENTS


def otel_generate(prompt: str) -> str:
    with _otel.start_as_current_span("generate") as span:
        span.set_attribute("openinference.span.kind", "LLM")
        span.set_attribute("llm.model_name", "test-model")
        span.set_attribute("input.value", prompt)
        text = "Open Settings > Security."
        span.set_attribute("output.value", text)
        return text


def otel_answer(question: str, gold_contexts: list[str], gold_ids: list[str]) -> str:
    with _otel.start_as_current_span("reliability-app") as span:
        span.set_attribute("openinference.span.kind", "CHAIN")
        span.set_attribute("input.value", question)
        docs = otel_search(question)
        text = _answer_text(question, docs, otel_generate(question))
        span.set_attribute("output.value", text)
        return text


# -- the loop -----------------------------------------------------------------------------------


def percentile(sorted_values: list[float], share: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(share * len(sorted_values)))
    return sorted_values[index]


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / (1024 * 1024)
    except OSError:
        return 0.0


def main(argv: list[str] | None = None) -> int:
    global trace_ids
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--mode", choices=("recalltrace", "otel"), default="recalltrace")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ids-file", default=None)
    parser.add_argument("--max-queue-size", type=int, default=2048)
    parser.add_argument("--max-write-attempts", type=int, default=5)
    parser.add_argument("--retry-backoff", type=float, default=0.5)
    parser.add_argument("--flush-timeout", type=float, default=60.0)
    parser.add_argument(
        "--progress-file",
        default=None,
        help="a file kept holding the number of calls made so far (read by the load harness)",
    )
    args = parser.parse_args(argv)

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    # Spans are recorded and exported (to nowhere) in both modes, as in a real service.
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    otel_trace.set_tracer_provider(provider)
    recalltrace.configure(
        database_url=args.database_url,
        service_name="reliability",
        max_queue_size=args.max_queue_size,
        max_write_attempts=args.max_write_attempts,
        retry_backoff=args.retry_backoff,
        flush_interval=0.2,
        tracer_provider="global",
    )
    if args.ids_file:
        trace_ids = []
    call: Callable[[str, list[str], list[str]], str] = (
        answer if args.mode == "recalltrace" else otel_answer
    )
    total = int(args.rate * args.seconds)
    latencies = array.array("d")
    wrong = 0
    errors = 0
    # (seconds in, RSS in MiB, calls made so far): on a busy host the calls lag the clock, and
    # memory follows the calls (queues and buffers fill to their bounds), not the seconds.
    rss: list[tuple[float, float, int]] = []
    made = [0]
    stop_sampling = threading.Event()
    started = time.monotonic()

    def sample_rss() -> None:
        while not stop_sampling.wait(0.5):
            seconds = round(time.monotonic() - started, 1)
            rss.append((seconds, round(current_rss_mib(), 1), made[0]))

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    if args.progress_file:
        progress_fd = os.open(args.progress_file, os.O_WRONLY | os.O_CREAT, 0o644)

        def report_progress() -> None:
            # A thread of its own: it goes on reporting (the same count) when the calls stop,
            # which is how the harness sees a request path waiting on storage.
            while not stop_sampling.wait(0.02):
                os.pwrite(progress_fd, made[0].to_bytes(8, "little"), 0)

        threading.Thread(target=report_progress, daemon=True).start()
    interval = 1.0 / args.rate
    gc.collect()
    print("STARTED", flush=True)
    for index in range(total):
        due = started + index * interval
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        made[0] = index
        question = f"question {index}"
        expected = _answer_text(question, DOCUMENTS, "Open Settings > Security.")
        begin = time.perf_counter()
        try:
            result = call(question, GOLD_CONTEXTS, GOLD_IDS)
        except Exception:
            errors += 1
            continue
        finally:
            latencies.append(time.perf_counter() - begin)
        if result != expected:
            wrong += 1
    elapsed = time.monotonic() - started
    stop_sampling.set()
    flushed = recalltrace.flush(args.flush_timeout)
    ledger = recalltrace.ledger()
    dropped: dict[str, int] = {}
    for counts in (ledger.dropped, ledger.other_dropped):
        for reason, count in counts.items():
            dropped[reason] = dropped.get(reason, 0) + count
    if args.ids_file and trace_ids is not None:
        with open(args.ids_file, "w", encoding="utf-8") as out:
            out.write("\n".join(trace_ids) + "\n")
    ordered = sorted(latencies)
    per_second: list[float] = []
    per_call = int(args.rate)
    for start in range(0, len(latencies), max(per_call, 1)):
        window = sorted(latencies[start : start + per_call])
        per_second.append(round(percentile(window, 0.99) * 1000, 3))
    summary = {
        "mode": args.mode,
        "calls": total,
        "wrong": wrong,
        "errors": errors,
        "elapsed_s": round(elapsed, 3),
        "achieved_rate": round(total / elapsed, 1),
        "p50_ms": round(percentile(ordered, 0.50) * 1000, 4),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 4),
        "max_ms": round(ordered[-1] * 1000 if ordered else 0.0, 4),
        "p99_ms_by_second": per_second,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_mib": rss,
        "sampled": ledger.seen - ledger.sampled_out,
        "dropped": dropped,
        "flushed": flushed,
    }
    recalltrace.shutdown(5.0)
    provider.shutdown()
    print(json.dumps(summary), flush=True)
    return 0 if errors == 0 and wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
