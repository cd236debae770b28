"""Load test of the tracer: 2,000 traced requests per second for 60 seconds, queue bound reached.

An app process calls a traced RAG request (root, retriever, generator) on an open-loop schedule
against a scratch Postgres database. From second 20 to second 35 the database refuses every
connection (``ALLOW_CONNECTIONS false``, open connections terminated), so the writer cannot
store anything, the queue fills to its bound (2,048) and the rest is dropped and counted. A
baseline run of the same request with OpenTelemetry spans written by hand, at the same rate,
gives the reference for the overhead target. Prints the figures recorded in
``benchmarks/README.md`` (section *Reliability load test*) and exits non-zero when a guarantee
does not hold (wrong results, an uncounted loss, a call blocked on storage).

Run: ``python -m benchmarks.load_test [--rate 2000] [--seconds 60]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks._pg import scratch_database
from tests.reliability.load import rss_growth_mib, run_load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--outage-from", type=float, default=20.0)
    parser.add_argument("--outage-to", type=float, default=35.0)
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    parser.add_argument("--max-queue-size", type=int, default=2048)
    parser.add_argument("--json", default=None, help="also write the summaries to this file")
    args = parser.parse_args()

    name = f"rt_load_test_{os.getpid()}"
    with scratch_database(name) as url:
        baseline = run_load(
            url, rate=args.rate, seconds=args.baseline_seconds, outage=None, mode="otel"
        )
        traced = run_load(
            url,
            rate=args.rate,
            seconds=args.seconds,
            outage=(args.outage_from, args.outage_to),
            max_queue_size=args.max_queue_size,
        )
    dropped = traced["dropped"]
    accounted = traced["stored"] + sum(dropped.values())
    growth = rss_growth_mib(traced, after_s=10.0)
    rows = [
        ("calls", f"{traced['calls']:,} at {traced['achieved_rate']:,.0f}/s"),
        ("wrong results / exceptions", f"{traced['wrong']} / {traced['errors']}"),
        ("stored", f"{traced['stored']:,}"),
        ("dropped (counted)", ", ".join(f"{k} {v:,}" for k, v in sorted(dropped.items()))),
        ("stored + dropped", f"{accounted:,} (expected {traced['calls']:,})"),
        ("peak RSS", f"{traced['peak_rss_mib']:.1f} MiB (baseline {baseline['peak_rss_mib']:.1f})"),
        ("RSS growth from 10 s to the end", f"{growth:+.1f} MiB"),
        (
            "request path p50 / p99 / max",
            f"{traced['p50_ms']:.3f} / {traced['p99_ms']:.3f} / {traced['max_ms']:.1f} ms",
        ),
        (
            "hand-written OpenTelemetry p50 / p99 / max",
            f"{baseline['p50_ms']:.3f} / {baseline['p99_ms']:.3f} / {baseline['max_ms']:.1f} ms",
        ),
        (
            "ratio p50 / p99",
            f"{traced['p50_ms'] / baseline['p50_ms']:.2f} / "
            f"{traced['p99_ms'] / baseline['p99_ms']:.2f}",
        ),
        ("final flush completed", str(traced["flushed"])),
    ]
    print("| figure | value |\n| --- | --- |")
    for label, value in rows:
        print(f"| {label} | {value} |")
    print("p99 (ms) by second:", traced["p99_ms_by_second"])
    print("RSS (s, MiB, calls):", traced["rss_mib"])
    if args.json:
        Path(args.json).write_text(json.dumps({"traced": traced, "baseline": baseline}))
    problems = []
    if traced["wrong"] or traced["errors"]:
        problems.append("calls returned wrong results or raised")
    if accounted != traced["calls"]:
        problems.append("calls neither stored nor counted as dropped")
    if not dropped.get("queue_full"):
        problems.append("the queue bound was never reached")
    if set(dropped) - {"queue_full"}:
        problems.append("accepted traces were dropped after the outage")
    if traced["max_ms"] > 250:
        problems.append("a call took longer than 250 ms")
    if growth > 25:
        problems.append("memory grew by more than 25 MiB")
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
