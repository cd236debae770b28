"""Scrubbing under load: an application serving 100 requests a second, each retrieving ten
distinct documents of 5 KB, every request stored in Postgres and scrubbed on the way.

Each variant runs in its own process: the application paces its requests at ``--rate`` a
second for ``--seconds`` (one thread; a request is a ``rag`` root calling a ``retrieval`` and a
``generation``), then flushes and reads the tracer's ledger. The documents are cut from the
ordinary engineering corpus and numbered, so no two are alike and the scrubber's memory of
clean documents never answers for one. Variants: the writer thread stores (and scrubs), a
storage process does, and the writer thread with scrubbing off (the reference: what storing
costs without the scrubber).

Targets (exit status 1 when one is missed): no record dropped for ``queue_full`` (nor for any
other reason), and the requests served at the asked rate (at least 95% of it), in every
variant.

Run: ``python -m benchmarks.scrub_load [--rate 100] [--seconds 30] [--documents 10]
[--document-bytes 5000]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "writer thread": {"storage_process": False, "scrubbing": True},
    "storage process": {"storage_process": True, "scrubbing": True},
    "writer thread, scrubbing off": {"storage_process": False, "scrubbing": False},
}
RATE_SHARE_TARGET = 0.95


def documents_for(request: int, count: int, size: int, corpus: str) -> list[dict[str, Any]]:
    """``count`` documents of ``size`` characters, distinct for every request and position."""
    out = []
    for position in range(count):
        start = (request * 7919 + position * 3301) % (len(corpus) - size)
        text = f"[{request}.{position}] " + corpus[start : start + size]
        out.append(
            {
                "id": f"kb-{request}-{position}",
                "content": text[:size],
                "score": 0.5,
                "metadata": {"source": f"runbook-{position}.md", "page": position},
            }
        )
    return out


def run_variant(database_url: str, options: dict[str, Any], args: argparse.Namespace) -> None:
    """The application (in a process of its own): serve, flush, print the ledger as JSON."""
    import recalltrace
    from tests.reliability.ordinary_corpus import SENTENCES

    corpus = " ".join(SENTENCES)
    while len(corpus) < args.document_bytes * 4:
        corpus += " " + corpus
    recalltrace.configure(
        database_url=database_url,
        sample_rate=1.0,
        service_name="scrub-load",
        storage_process=options["storage_process"],
        scrubbing=options["scrubbing"],
    )
    current: list[list[dict[str, Any]]] = [[]]

    @recalltrace.retrieval
    def search(question: str) -> list[dict[str, Any]]:
        return current[0]

    @recalltrace.generation(model="gpt-4o-mini")
    def generate(question: str) -> str:
        return "Restart the worker and check the queue depth."

    @recalltrace.rag("support-bot")
    def answer(question: str) -> str:
        search(question)
        return generate(question)

    total = int(args.rate * args.seconds)
    interval = 1.0 / args.rate
    late = 0.0
    started = time.perf_counter()
    for request in range(total):
        due = started + request * interval
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        else:
            late = max(late, now - due)
        # Built before the request: the application's own work, not the tracer's.
        current[0] = documents_for(request, args.documents, args.document_bytes, corpus)
        answer(f"How do I recover from incident {request}?")
    served = time.perf_counter() - started
    flushed = recalltrace.flush(300)
    ledger = recalltrace.ledger()
    print(
        json.dumps(
            {
                "served": total,
                "seconds": served,
                "rate": total / served,
                "late_s": late,
                "flushed": flushed,
                "stored": ledger.stored,
                "dropped": dict(ledger.dropped),
                "pending": ledger.pending,
            }
        ),
        flush=True,
    )
    recalltrace.shutdown(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="requests a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each variant runs")
    parser.add_argument("--documents", type=int, default=10, help="documents per request")
    parser.add_argument("--document-bytes", type=int, default=5000, help="characters each")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant is not None:
        run_variant(args.database_url, VARIANTS[args.variant], args)
        return

    from benchmarks._pg import scratch_database

    results: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        with scratch_database("recalltrace_bench_scrub_load") as url:
            env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
            env["RECALLTRACE_RUN_DIR"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / "rt-bench")
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.scrub_load", "--variant", variant,
                 "--database-url", url, "--rate", str(args.rate), "--seconds", str(args.seconds),
                 "--documents", str(args.documents), "--document-bytes", str(args.document_bytes)],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.seconds * 10 + 600,
            )  # fmt: skip
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{variant}: the application exited {done.returncode}")
            results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"{args.rate:g} requests/s for {args.seconds:g} s, {args.documents} distinct documents "
        f"of {args.document_bytes} characters each"
    )
    print(f"{'variant':32} {'rate/s':>7} {'stored':>7} {'queue_full':>10} {'other drops':>11}")
    missed = []
    for variant, result in results.items():
        dropped = result["dropped"]
        queue_full = int(dropped.get("queue_full", 0))
        other = sum(int(v) for k, v in dropped.items() if k != "queue_full")
        print(
            f"{variant:32} {result['rate']:7.1f} {result['stored']:7d} {queue_full:10d} {other:11d}"
        )
        if queue_full or other or result["stored"] != result["served"]:
            missed.append(f"{variant}: {result['served'] - result['stored']} not stored {dropped}")
        if result["rate"] < args.rate * RATE_SHARE_TARGET:
            missed.append(f"{variant}: served {result['rate']:.1f}/s of {args.rate:g}/s")
    for line in missed:
        print(f"MISSED: {line}")
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
