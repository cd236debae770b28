"""End-to-end scoring throughput of worker processes on Postgres.

The judge is the scripted OpenAI-compatible server in its own process with a fixed latency, so
the judge is the only slow part. Each configuration writes fresh traces, starts N
``recalltrace worker --once`` processes with a fixed concurrency each, and measures the rate at
which scores land in the database between 10% and 90% of the work (process start-up, which
imports LiteLLM, is outside that window). The bound is N x concurrency / latency.

    python -m benchmarks.worker [--latency 0.2] [--concurrency 16] [--seconds 15]

Also measured: the non-LLM variants alone (database-bound), the workers' own figure of
database time per job, and the CPU used inside the window: the whole machine's busy cores, and
the workers', Postgres' and the judge server's shares of them, read from /proc.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select, text

from benchmarks._cpu import machine_busy_s, process_cpu_s
from benchmarks._pg import scratch_database
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import Score
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import start_process


def write_traces(url: str, metrics: list[str], count: int) -> None:
    engine = create_engine_from_url(url)
    with engine.begin() as conn:
        conn.execute(
            text("TRUNCATE scores, scoring_jobs, retrieved_contexts, trace_tags, labels, traces")
        )
    repo = make_repository(engine, metrics=metrics)
    batch = [
        make_trace(
            contexts=10,
            context_chars=300,
            reference_contexts=["Paris is the capital and most populous city of France."],
            reference_context_ids=["doc_1", "doc_42"],
        )
        for _ in range(count)
    ]
    for start in range(0, count, 1000):
        repo.write_traces(batch[start : start + 1000])
    repo.dispose()


def cpu_snapshot(workers: list[int], judge_pid: int) -> dict[str, float]:
    """CPU seconds so far: the machine's busy time, the workers, Postgres and the judge."""
    postgres = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    postgres += process_cpu_s(int(entry.name))
            except OSError:
                continue
    return {
        "machine": machine_busy_s(),
        "workers": sum(process_cpu_s(pid) for pid in workers),
        "postgres": postgres,
        "judge": process_cpu_s(judge_pid),
    }


def run(
    url: str, judge_url: str | None, metrics: list[str], processes: int, concurrency: int,
    expected: int, judge_pid: int,
) -> tuple[float, list[float], dict[str, float]]:  # fmt: skip
    """Start the workers; return (scores/s between 10% and 90%, db ms per job per worker,
    cores used in that window by the machine, the workers, Postgres and the judge)."""
    cmd = [
        sys.executable, "-m", "recalltrace", "worker", "--database-url", url, "--once",
        "--no-progress", "--concurrency", str(concurrency), "--batch-size", str(concurrency),
    ]  # fmt: skip
    for metric in metrics:
        cmd += ["--metric", metric]
    if judge_url:
        # A model in LiteLLM's price list, served by the local judge: a deployment's cost path.
        cmd += ["--judge-model", "openai/gpt-4o-mini", "--judge-api-base", judge_url]
    env = dict(os.environ, OPENAI_API_KEY="bench-key")
    procs = [
        subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    engine = create_engine_from_url(url)
    marks: dict[float, float] = {}
    cpu: dict[float, dict[str, float]] = {}
    pids = [p.pid for p in procs]
    low, high = 0.1 * expected, 0.9 * expected
    while any(p.poll() is None for p in procs):
        with engine.connect() as conn:
            done = conn.scalar(select(func.count()).select_from(Score)) or 0
        now = time.perf_counter()
        for mark in (low, high):
            if done >= mark and mark not in marks:
                marks[mark] = now
                cpu[mark] = cpu_snapshot(pids, judge_pid)
        time.sleep(0.05)
    engine.dispose()
    db_ms = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"worker failed: {err[-2000:]}")
        match = re.search(r"database time per job ([\d.]+) ms", out)
        if match:
            db_ms.append(float(match.group(1)))
    if low not in marks or high not in marks or marks[high] <= marks[low]:
        raise SystemExit("the run was too short to measure; raise --seconds")
    window = marks[high] - marks[low]
    cores = {key: (cpu[high][key] - cpu[low][key]) / window for key in cpu[low]}
    return (high - low) / window, db_ms, cores


def describe_cores(cores: dict[str, float], rate: float) -> str:
    return (
        f"cores busy {cores['machine']:.2f} of {os.cpu_count()} (workers {cores['workers']:.2f}, "
        f"Postgres {cores['postgres']:.2f}, judge server {cores['judge']:.2f}); worker CPU "
        f"{cores['workers'] / rate * 1000:.2f} ms/job"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=16, help="per worker process")
    parser.add_argument("--seconds", type=float, default=15.0, help="work per run at the bound")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    judge, judge_url = start_process("--latency", str(args.latency))
    rows = []
    try:
        with scratch_database("rt_bench_worker") as url:
            metrics = ["non_llm_context_recall", "id_based_context_recall"]
            count = 10_000
            write_traces(url, metrics, count)
            rate, db_ms, cores = run(url, None, metrics, 1, 64, count * len(metrics), judge.pid)
            print(
                f"non-LLM variants, 1 worker: {rate:,.0f} scores/s; database time per job "
                f"{', '.join(f'{d:.2f}' for d in db_ms)} ms; {describe_cores(cores, rate)}",
                flush=True,
            )
            for n in args.workers:
                bound = n * args.concurrency / args.latency
                traces = int(bound * args.seconds)
                write_traces(url, ["judge_context_recall"], traces)
                rate, db_ms, cores = run(
                    url, judge_url, ["judge_context_recall"], n, args.concurrency, traces,
                    judge.pid,
                )  # fmt: skip
                rows.append((n, bound, rate, db_ms, cores))
                print(
                    f"{n} worker(s): {rate:,.1f} scores/s, bound {bound:,.0f}/s, "
                    f"ratio {rate / bound:.2f}; database time per job "
                    f"{', '.join(f'{d:.2f}' for d in db_ms)} ms; {describe_cores(cores, rate)}",
                    flush=True,
                )
    finally:
        judge.terminate()
        judge.wait(timeout=10)
    print()
    print(
        f"judge_context_recall (one judge call per job), judge latency {args.latency * 1000:.0f} "
        f"ms, {args.concurrency} jobs in flight per worker process"
    )
    print(
        f"{'workers':>8} {'bound/s':>9} {'scores/s':>9} {'ratio':>6} {'db ms/job':>10} "
        f"{'cores busy':>11} {'workers':>8} {'Postgres':>9} {'judge':>6} {'worker CPU ms/job':>18}"
    )
    for n, bound, rate, db_ms, cores in rows:
        mean_db = sum(db_ms) / len(db_ms) if db_ms else float("nan")
        print(
            f"{n:>8} {bound:>9.0f} {rate:>9.1f} {rate / bound:>6.2f} {mean_db:>10.2f} "
            f"{cores['machine']:>11.2f} {cores['workers']:>8.2f} {cores['postgres']:>9.2f} "
            f"{cores['judge']:>6.2f} {cores['workers'] / rate * 1000:>18.2f}"
        )


if __name__ == "__main__":
    main()
