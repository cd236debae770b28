"""A traced RAG app as a process: calls a decorated request at a steady rate and reports.

Used by the fault-injection tests and ``benchmarks/load_test.py``::

    python -m tests.reliability.app_process --database-url URL --rate 200 --seconds 10 \\
        --ids-file ids.txt [--max-queue-size N] [--flush-timeout S]

Each request runs ``@tracer.rag`` around ``@tracer.retrieval`` and checks that the decorated
function returned exactly what the undecorated body returned. The trace id of every request is
written to ``--ids-file``. The last line printed is one JSON object: calls, wrong results,
exceptions, latency percentiles of the request path (ms), peak RSS (MiB), the tracer's
counters (sampled, dropped by reason) and whether the final flush completed.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import threading
import time
from typing import Any

import tracer
from tracer._runtime import stats

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

tracer_ids: list[str] = []
"""Trace id of every request, in call order."""


@tracer.retrieval
def search(query: str) -> list[dict[str, Any]]:
    return DOCUMENTS


@tracer.rag(
    "reliability-app",
    reference_contexts_param="gold_contexts",
    reference_context_ids_param="gold_ids",
)
def answer(question: str, gold_contexts: list[str], gold_ids: list[str]) -> str:
    docs = search(question)
    tracer_ids.append(tracer.current_trace_id() or "")
    return f"{question} -> {len(docs)} documents"


def percentile(sorted_values: list[float], share: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(share * len(sorted_values)))
    return sorted_values[index]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ids-file", default=None)
    parser.add_argument("--max-queue-size", type=int, default=2048)
    parser.add_argument("--max-write-attempts", type=int, default=5)
    parser.add_argument("--flush-timeout", type=float, default=60.0)
    parser.add_argument("--rss-samples", default=None, help="file for RSS samples (s, MiB)")
    args = parser.parse_args(argv)

    tracer.configure(
        database_url=args.database_url,
        service_name="reliability",
        max_queue_size=args.max_queue_size,
        max_write_attempts=args.max_write_attempts,
        flush_interval=0.2,
        tracer_provider="own",
    )
    gold_contexts = [str(DOCUMENTS[0]["content"])]
    gold_ids = ["kb-0", "kb-9"]
    latencies: list[float] = []
    wrong = 0
    errors = 0
    rss: list[tuple[float, float]] = []
    stop_sampling = threading.Event()

    def sample_rss() -> None:
        while not stop_sampling.wait(0.5):
            rss.append((time.monotonic() - started, current_rss_mib()))

    started = time.monotonic()
    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    interval = 1.0 / args.rate
    total = int(args.rate * args.seconds)
    gc.collect()
    for index in range(total):
        # Open-loop schedule: a slow request does not lower the offered rate.
        due = started + index * interval
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        question = f"question {index}"
        expected = f"{question} -> {len(DOCUMENTS)} documents"
        begin = time.perf_counter()
        try:
            result = answer(question, gold_contexts, gold_ids)
        except Exception:
            errors += 1
            continue
        finally:
            latencies.append(time.perf_counter() - begin)
        if result != expected:
            wrong += 1
    elapsed = time.monotonic() - started
    stop_sampling.set()
    flushed = tracer.flush(args.flush_timeout)
    snapshot = stats().snapshot()
    dropped: dict[str, int] = {}
    for (reason, _app), count in snapshot["dropped"].items():
        dropped[reason] = dropped.get(reason, 0) + count
    if args.ids_file:
        with open(args.ids_file, "w", encoding="utf-8") as out:
            out.write("\n".join(tracer_ids) + "\n")
    if args.rss_samples:
        with open(args.rss_samples, "w", encoding="utf-8") as out:
            out.writelines(f"{t:.1f} {mib:.1f}\n" for t, mib in rss)
    ordered = sorted(latencies)
    summary = {
        "calls": total,
        "wrong": wrong,
        "errors": errors,
        "elapsed_s": round(elapsed, 3),
        "achieved_rate": round(total / elapsed, 1),
        "p50_ms": round(percentile(ordered, 0.50) * 1000, 4),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 4),
        "max_ms": round(ordered[-1] * 1000 if ordered else 0.0, 4),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_first_mib": rss[1][1] if len(rss) > 1 else None,
        "rss_last_mib": rss[-1][1] if rss else None,
        "sampled": sum(snapshot["sampled"].values()),
        "dropped": dropped,
        "flushed": flushed,
    }
    tracer.shutdown(5.0)
    print(json.dumps(summary), flush=True)
    return 0 if errors == 0 and wrong == 0 else 1


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / (1024 * 1024)
    except OSError:
        return 0.0


if __name__ == "__main__":
    sys.exit(main())
