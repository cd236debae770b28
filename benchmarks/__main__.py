"""Run the benchmarks whose figures ``benchmarks/README.md`` holds, one after the other.

``python -m benchmarks`` runs every entry of ``PLAN`` (``--only NAME[,NAME]`` some of them,
``--list`` shows them), saves each one's output under ``--out`` (a new temporary folder unless
given) and ends with one line per run: its exit code and where its output is. Each benchmark
exits non-zero when it misses its target, so this command does too when any of them missed: a
regression shows the day it lands. Run it on a machine doing nothing else.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAN: list[tuple[str, list[str]]] = [
    # name, arguments of ``python -m`` (the tracer's three sizes, three runs each)
    *[(f"tracer_overhead-10docs-{run}", ["benchmarks.tracer_overhead"]) for run in (1, 2, 3)],
    *[
        (
            f"tracer_overhead-100docs-{run}",
            ["benchmarks.tracer_overhead", "--documents", "100", "--calls", "8000"],
        )
        for run in (1, 2, 3)
    ],
    *[
        (
            f"tracer_overhead-1000docs-{run}",
            ["benchmarks.tracer_overhead", "--documents", "1000", "--calls", "2000"],
        )
        for run in (1, 2, 3)
    ],
    ("tracer_overhead-10docs-new", ["benchmarks.tracer_overhead", "--new-documents"]),
    ("saturation", ["benchmarks.saturation"]),
    ("forked_jobs", ["benchmarks.forked_jobs"]),
    ("ingest", ["benchmarks.ingest"]),
    ("storage_ingest", ["benchmarks.storage_ingest"]),
    ("scrub", ["benchmarks.scrub"]),
    ("scrub_load", ["benchmarks.scrub_load"]),
    ("worker", ["benchmarks.worker"]),
    ("history", ["benchmarks.history"]),
    ("load_test", ["benchmarks.load_test"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names (prefixes) to run")
    parser.add_argument("--out", default=None, help="folder for each run's output")
    parser.add_argument("--list", action="store_true", help="list the runs and exit")
    args = parser.parse_args()
    chosen = [
        (name, command)
        for name, command in PLAN
        if not args.only or any(name.startswith(p.strip()) for p in args.only.split(","))
    ]
    if args.list:
        for name, command in PLAN:
            print(f"{name:<28} python -m {' '.join(command)}")
        return
    if not chosen:
        raise SystemExit(f"--only {args.only!r} matches no benchmark (see --list)")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="recalltrace-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    results: list[tuple[str, int, float, Path]] = []
    for name, command in chosen:
        log = out / f"{name}.txt"
        print(f"==> {name}: python -m {' '.join(command)}", flush=True)
        started = time.monotonic()
        with log.open("w", encoding="utf-8") as handle:
            proc = subprocess.Popen(
                [sys.executable, "-m", *command],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                handle.write(line)
                sys.stdout.write(line)
            code = proc.wait()
        results.append((name, code, time.monotonic() - started, log))
    print("\nsummary")
    for name, code, seconds, log in results:
        verdict = "ok" if code == 0 else f"exit {code} (a target missed or the run failed)"
        print(f"  {name:<28} {verdict:<44} {seconds:7.0f} s  {log}")
    if any(code != 0 for _, code, _, _ in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
