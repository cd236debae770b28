"""Time per job when every job runs in a process forked for it and ended with ``os._exit``.

RQ's default worker forks a work horse per job and ends it with ``os._exit(0)``; hand-written
``os.fork()`` loops do the same. Each variant runs in a parent process of its own, which forks
``--jobs`` children one after the other; each child runs one traced request (a root calling a
retriever that returns 10 documents of 300 characters, and a generator) and calls
``os._exit(0)``. The figure is the wall time from the fork to the parent's ``waitpid``, median
over the jobs, after ``--warmup`` jobs:

- ``no tracing``: the plain functions;
- ``OpenTelemetry by hand``: the same spans written with the SDK (a batch processor and a
  discarding exporter; what a child holds at ``os._exit`` is lost, as OpenTelemetry does);
- ``recalltrace``: the decorators at sample rate 1, storing into Postgres, with
  ``storage_process`` left to choose (the default: a job's process writes once, at its end, so
  from its writer thread), ``False`` (the writer thread, and the parent loads the database stack
  before it forks) and ``True`` (a storage process per job); every job's record must be stored
  (``os._exit`` drains), or the script exits 1.

``--configure-in-child`` has each child configure the tracer itself, as under the ``rq worker``
command (which imports the job's module in the work horse); by default the parent configures
once and the children inherit it, as a script that configures and then runs
``Worker(...).work()`` does.

    python -m benchmarks.forked_jobs [--jobs 40] [--warmup 3] [--configure-in-child]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks._pg import scratch_database

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("plain", "otel", "auto", "writer", "process")
NAMES = {
    "plain": "no tracing",
    "otel": "OpenTelemetry by hand",
    "auto": "recalltrace, the default",
    "writer": "recalltrace, writer thread",
    "process": "recalltrace, storage process",
}


def run_variant(variant: str, url: str, jobs: int, warmup: int, in_child: bool) -> list[float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks._forked_parent",
            variant,
            url,
            str(jobs),
            str(warmup),
            "1" if in_child else "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")},
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def stored(url: str, variant: str) -> int:
    from sqlalchemy import text

    from recalltrace.storage.db import create_engine_from_url

    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM traces WHERE service_name = :s"),
                    {"s": f"forked-{variant}"},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--configure-in-child", action="store_true")
    args = parser.parse_args()
    missed = False
    with scratch_database("forked_jobs") as url:
        from recalltrace.storage.migrate import upgrade

        upgrade(url)
        rows = []
        for variant in VARIANTS:
            times = run_variant(variant, url, args.jobs, args.warmup, args.configure_in_child)
            rows.append((variant, statistics.median(times), max(times)))
            if variant in ("auto", "writer", "process"):
                kept = stored(url, variant)
                expected = args.jobs + args.warmup
                if kept != expected:
                    print(f"{NAMES[variant]}: {kept} of {expected} jobs' records stored: MISSED")
                    missed = True
    where = "each child configures" if args.configure_in_child else "the parent configures"
    print(f"{args.jobs} jobs per variant after {args.warmup} warm-up, {where}")
    base = rows[1][1]
    print(f"{'variant':<32} {'median ms/job':>14} {'max ms':>9} {'/ by hand':>10}")
    for variant, median, most in rows:
        ratio = median / base
        print(f"{NAMES[variant]:<32} {median * 1000:>14.1f} {most * 1000:>9.1f} {ratio:>10.2f}")
    if missed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
