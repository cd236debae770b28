"""Trace ingest rate through the repository's batch path against raw psycopg COPY.

Each trace record carries 10 retrieved contexts of 300 characters. Both sides write the same
rows (traces, contexts and the scoring jobs of all six variants) into the same Postgres, in
batches of the same size, one transaction per batch. The raw side is psycopg's COPY in its
faster binary form, with nothing else around it.

    python -m benchmarks.storage_ingest [--traces 20000] [--batch 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timezone

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import text

from benchmarks._pg import scratch_database
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.records import ContextRecord, TraceRecord
from tests.support.factories import make_repository, new_trace_id

CONTEXT = ("Retrieval-augmented generation grounds answers in retrieved passages. " * 5)[:300]


def make_records(n: int) -> list[TraceRecord]:
    now = datetime.now(timezone.utc)
    return [
        TraceRecord(
            trace_id=new_trace_id(),
            app_name="bench-app",
            service_name="bench",
            started_at=now,
            duration_ms=12.5,
            user_input="How does retrieval-augmented generation ground its answers?",
            response="It retrieves passages and conditions the answer on them. " * 6,
            retrieved_contexts=[
                ContextRecord(
                    content=CONTEXT, id=f"doc-{i}", score=0.9 - i / 100, metadata={"i": i}
                )
                for i in range(10)
            ],
            reference="Answers are grounded in retrieved passages.",
            reference_contexts=[CONTEXT],
            reference_context_ids=["doc-1"],
            metadata={"tenant": "acme"},
        )
        for _ in range(n)
    ]


def truncate(url: str) -> None:
    engine = create_engine_from_url(url)
    with engine.begin() as conn:
        conn.execute(
            text("TRUNCATE scores, scoring_jobs, retrieved_contexts, trace_tags, labels, traces")
        )
    engine.dispose()


def run_repository(url: str, records: list[TraceRecord], batch: int) -> float:
    repo = make_repository(create_engine_from_url(url))
    start = time.perf_counter()
    for i in range(0, len(records), batch):
        repo.write_traces(records[i : i + batch])
    elapsed = time.perf_counter() - start
    repo.dispose()
    return len(records) / elapsed


def run_raw_copy(
    url: str, records: list[TraceRecord], batch: int, metrics: list[tuple[str, str]]
) -> float:
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        for i in range(0, len(records), batch):
            chunk = records[i : i + batch]
            now = datetime.now(timezone.utc)
            with conn.transaction(), conn.cursor() as cur:
                with cur.copy(
                    "COPY traces (trace_id, app_name, service_name, started_at, duration_ms,"
                    " user_input, response, reference, reference_contexts, reference_context_ids,"
                    " metadata, error, notes, created_at) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(
                        [
                            "varchar",
                            "varchar",
                            "varchar",
                            "timestamptz",
                            "float8",
                            "text",
                            "text",
                            "text",
                            "jsonb",
                            "jsonb",
                            "jsonb",
                            "bool",
                            "jsonb",
                            "timestamptz",
                        ]
                    )
                    for r in chunk:
                        copy.write_row(
                            (
                                r.trace_id,
                                r.app_name,
                                r.service_name,
                                r.started_at,
                                r.duration_ms,
                                r.user_input,
                                r.response,
                                r.reference,
                                Jsonb(r.reference_contexts),
                                Jsonb(r.reference_context_ids),
                                Jsonb(r.metadata),
                                r.error,
                                Jsonb(r.notes),
                                now,
                            )
                        )
                with cur.copy(
                    "COPY retrieved_contexts (trace_id, position, context_id, content, score,"
                    " metadata) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(["varchar", "int4", "varchar", "text", "float8", "jsonb"])
                    for r in chunk:
                        for pos, c in enumerate(r.retrieved_contexts):
                            copy.write_row(
                                (r.trace_id, pos, c.id, c.content, c.score, Jsonb(c.metadata))
                            )
                with cur.copy(
                    "COPY scoring_jobs (trace_id, metric, version, status, attempts, run_at,"
                    " created_at, updated_at) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(
                        [
                            "varchar",
                            "varchar",
                            "varchar",
                            "varchar",
                            "int4",
                            "timestamptz",
                            "timestamptz",
                            "timestamptz",
                        ]
                    )
                    for r in chunk:
                        for key, version in metrics:
                            copy.write_row((r.trace_id, key, version, "queued", 0, now, now, now))
        elapsed = time.perf_counter() - start
    return len(records) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from recalltrace.scorers.catalog import CATALOG

    metrics = [(k, v.version) for k, v in CATALOG.items()]
    ours: list[float] = []
    raw: list[float] = []
    with scratch_database("rt_bench_ingest") as url:
        for round_no in range(args.rounds):
            # Fresh ids each round; alternate the order so neither side always runs warm.
            records = make_records(args.traces)
            order = [("repo", run_repository), ("raw", run_raw_copy)]
            if round_no % 2:
                order.reverse()
            for name, fn in order:
                truncate(url)
                rate = (
                    fn(url, records, args.batch, metrics)
                    if name == "raw"
                    else fn(url, records, args.batch)
                )  # type: ignore[operator]
                (raw if name == "raw" else ours).append(rate)
                print(f"round {round_no + 1}: {name:>4}: {rate:,.0f} traces/s", flush=True)
    ours_med = statistics.median(ours)
    raw_med = statistics.median(raw)
    print()
    print(
        f"traces of 10 x 300-char contexts, batches of {args.batch}, "
        f"{args.traces:,} per round, {args.rounds} rounds"
    )
    print(f"repository batch path : {ours_med:,.0f} traces/s ({ours_med * 10:,.0f} contexts/s)")
    print(f"raw psycopg COPY      : {raw_med:,.0f} traces/s")
    ratio = ours_med / raw_med
    verdict = "met" if ratio >= 0.5 else "NOT met"
    print(f"ratio                 : {ratio:.2f} of raw COPY (target >= 0.50: {verdict})")
    if ratio < 0.5:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
