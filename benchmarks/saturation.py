"""A FastAPI service at full speed: requests per second with the tracer against hand-written spans.

One uvicorn process (one worker) per variant serves ``benchmarks.saturation_app``; ``hey``
(Debian's package, ``apt-get install hey``) keeps ``--connections`` requests in flight for
``--seconds`` and reports the throughput. Variants: no tracing; OpenTelemetry spans written by
hand; the decorators at sample rate 0; at 0.1 and at 1 storing the sampled requests to Postgres,
from the tracer's writer thread (``rate0.1``, ``rate1``: the default) and through a storage
process (``rate0.1p``, ``rate1p``: ``storage_process=True``, the setting for a busy service;
``rate1pn``: that process 10 below the application's CPU priority, ``storage_process_nice=10``).

Every variant's server is started and warmed up; then ``--repetitions`` rounds each give every
variant one short slice of load, in rotated order, each variant's slice between two slices of
the hand-written spans, and its throughput is divided by the mean of those two. Every
``--restart-every`` rounds all servers are stopped and started afresh: one process's placement
and memory layout (hash seed, address space) bias all of its slices alike, by as much as the
targets' margins, so a run samples several processes per variant. This machine's speed drifts by
tens of percent from one second to the next; slices side by side see the same machine, and the
median of many such ratios is what stays comparable from run to run. A slice starts as steady
load finds a server: half a second of load before it (not measured) queues what the server would
be holding anyway, whose storing the slice pays for; what the slice leaves queued is stored
before the next slice starts (not measured either), so that no other variant's slice pays for
it. The median is checked against the targets (the storage-process variants carry the storing
targets; the writer-thread variants are shown beside them), and the run exits 1 when one is
missed. Server CPU includes the storage process's. At the end every traced server's ledger is
read: a request seen but neither stored, sampled out nor counted as dropped fails the run.

Everything shares the machine's cores (the server, ``hey``, Postgres and the tracer's writer
thread), as in a deployment where the database or a sidecar lives on the same host.

Run: ``python -m benchmarks.saturation [--seconds 2] [--connections 32] [--repetitions 12]
[--restart-every 4]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks._cpu import TICK, tree_cpu_s
from benchmarks._pg import scratch_database


def postgres_cpu_s() -> float:
    """CPU seconds the local Postgres server's processes have used so far."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if text[text.index("(") + 1 : text.index(")")].startswith("postgres"):
            fields = text.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


ROOT = Path(__file__).resolve().parent.parent
LEAD_IN_S = 0.5
"""Seconds of load before each measured slice, which queue what steady load keeps queued (the
writer takes records in batches of 256: about a third of a second at this service's rates)."""
VARIANTS = ("plain", "otel", "rate0", "rate0.1", "rate0.1p", "rate1", "rate1p", "rate1pn")
TARGETS = {"rate0": 0.95, "rate0.1p": 0.95, "rate1p": 0.85}
"""Least share of the hand-written spans' throughput (issue figures; benchmarks/README.md)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the server did not answer {url} within {timeout:.0f} s")


def _hey(url: str, seconds: float, connections: int) -> tuple[float, int]:
    """``hey``'s requests per second, and how many were answered."""
    done = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(connections), url],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    if done.returncode != 0:
        raise SystemExit(f"hey failed: {done.stderr.strip()[:300]}")
    match = re.search(r"Requests/sec:\s+([0-9.]+)", done.stdout)
    statuses = re.findall(r"\[(\d{3})\]\s+(\d+) responses", done.stdout)
    bad = {code: int(n) for code, n in statuses if code != "200"}
    answered = sum(int(n) for code, n in statuses if code == "200")
    if match is None or bad or not answered:
        raise SystemExit(f"hey: no throughput or failed responses {bad}:\n{done.stdout[-800:]}")
    return float(match.group(1)), answered


class Server:
    """One variant's uvicorn process, started and warmed up, serving until :meth:`stop`."""

    def __init__(self, variant: str, database_url: str, warmup: float, connections: int) -> None:
        self.variant = variant
        port = _free_port()
        env = dict(os.environ)
        env.update(
            SATURATION_VARIANT=variant,
            SATURATION_DATABASE_URL=database_url,
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        for name in [key for key in env if key.startswith(("RECALLTRACE_", "OTEL_"))]:
            del env[name]
        command = [
            sys.executable, "-m", "uvicorn", "benchmarks.saturation_app:app",
            "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env)
        self.base = f"http://127.0.0.1:{port}"
        _wait_ready(f"{self.base}/ask?q=ready", self.proc)
        if warmup > 0:
            _hey(f"{self.base}/ask", warmup, connections)

    def measure(self, seconds: float, connections: int) -> dict[str, float]:
        """One slice of load: requests per second, and CPU per request of the server (its
        storage process included) and of Postgres.

        The slice starts as steady load finds a server: a lead-in of load (not measured) has
        queued what the server would be holding anyway, whose storing the slice pays for, as
        it would. What the slice itself leaves queued is stored before the next slice starts
        (not measured either), so that no other variant's slice pays for it. ``left`` is the
        share of the slice's requests still queued when it ended."""
        _hey(f"{self.base}/ask", LEAD_IN_S, connections)
        server_before, postgres_before = tree_cpu_s(self.proc.pid), postgres_cpu_s()
        rps, served = _hey(f"{self.base}/ask", seconds, connections)
        server_cpu, postgres_cpu = tree_cpu_s(self.proc.pid), postgres_cpu_s()
        with urllib.request.urlopen(f"{self.base}/flush", timeout=90) as response:
            flushed = json.loads(response.read())
        if not flushed["flushed"]:
            raise SystemExit(f"{self.variant}: the tracer did not flush within 60 s")
        return {
            "rps": rps,
            "server_ms": (server_cpu - server_before) * 1000 / served,
            "postgres_ms": (postgres_cpu - postgres_before) * 1000 / served,
            "left": flushed["pending"] / served,
        }

    def ledger(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base}/ledger", timeout=90) as response:
            return dict(json.loads(response.read()))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _run_rounds(
    servers: dict[str, Server],
    rounds: range,
    load: tuple[float, int],
    slices: dict[str, list[dict[str, float]]],
    shares: dict[str, list[float]],
) -> None:
    """Run ``rounds`` on one set of servers: each round gives every variant but the hand-written
    spans one slice of ``load`` (seconds, connections), in rotated order, each followed by a
    slice of the hand-written spans; a slice's share is its throughput over the mean of the
    hand-written slices just before and after it."""
    others = list(shares)
    before = servers["otel"].measure(*load)
    slices["otel"].append(before)
    for index in rounds:
        shift = index % len(others)
        line = []
        for variant in others[shift:] + others[:shift]:
            result = servers[variant].measure(*load)
            after = servers["otel"].measure(*load)
            slices[variant].append(result)
            slices["otel"].append(after)
            share = result["rps"] / ((before["rps"] + after["rps"]) / 2)
            shares[variant].append(share)
            line.append(f"{variant} {result['rps']:.0f} ({share:.2f})")
            before = after
        print(f"round {index + 1}: " + ", ".join(line), flush=True)


def _add_ledger(total: dict[str, Any], ledger: dict[str, Any]) -> None:
    """Add one server process's ledger to its variant's total (an untraced server has none)."""
    for key, value in ledger.items():
        if isinstance(value, dict):
            counts = total.setdefault(key, {})
            for reason, count in value.items():
                counts[reason] = counts.get(reason, 0) + count
        else:
            total[key] = total.get(key, 0) + value


def _ledger_problem(ledger: dict[str, Any]) -> str | None:
    if not ledger:
        return None
    dropped = sum(ledger["dropped"].values())
    accounted = ledger["stored"] + ledger["sampled_out"] + dropped + ledger["pending"]
    if accounted != ledger["seen"]:
        return f"{ledger['seen'] - accounted} request(s) unaccounted for"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of load per slice")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per server")
    parser.add_argument("--connections", type=int, default=32, help="requests in flight")
    parser.add_argument("--repetitions", type=int, default=12, help="rounds, in rotated order")
    parser.add_argument(
        "--restart-every",
        type=int,
        default=4,
        help="rounds after which every server is started afresh (0: never)",
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}"
    )
    args = parser.parse_args()
    if shutil.which("hey") is None:
        raise SystemExit("hey is not installed: apt-get install hey (the load generator)")
    variants = list(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "otel" not in variants:
        raise SystemExit(f"--variants: unknown {unknown}, or 'otel' (the baseline) missing")
    if len(variants) < 2:
        raise SystemExit("--variants: name at least one variant besides 'otel' to compare with it")
    if args.restart_every < 0 or args.repetitions < 1:
        raise SystemExit("--restart-every must be 0 or more and --repetitions 1 or more")
    block = args.restart_every or args.repetitions

    others = [variant for variant in variants if variant != "otel"]
    # Per variant, its slices (one a round; the hand-written spans' one more), and, for the
    # others, each slice's share of the hand-written spans' throughput just before and after.
    slices: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
    shares: dict[str, list[float]] = {variant: [] for variant in others}
    ledgers: dict[str, dict[str, Any]] = {variant: {} for variant in variants}
    with scratch_database("recalltrace_bench_saturation") as url:
        for first in range(0, args.repetitions, block):
            servers: dict[str, Server] = {}
            try:
                for variant in variants:
                    servers[variant] = Server(variant, url, args.warmup, args.connections)
                _run_rounds(
                    servers,
                    range(first, min(first + block, args.repetitions)),
                    (args.seconds, args.connections),
                    slices,
                    shares,
                )
                for variant, server in servers.items():
                    _add_ledger(ledgers[variant], server.ledger())
            finally:
                for server in servers.values():
                    server.stop()
    for variant, ledger in ledgers.items():
        if ledger:
            print(f"{variant} ledger {ledger}")

    print(
        f"\n{args.connections} connections, {args.seconds:g} s slices, {args.repetitions} rounds "
        "in rotated order, each variant's slice between two of the hand-written spans'; every "
        f"server started afresh every {block} rounds and warmed up for {args.warmup:g} s "
        "(one uvicorn worker each)"
    )
    print(
        f"{'variant':<10}{'req/s (median)':>16}{'server ms/req':>15}{'Postgres ms/req':>17}"
        f"{'left queued':>12}{'share of by-hand':>18}{'middle half of rounds':>24}"
    )
    missed = 0
    for variant in variants:
        rps = statistics.median(r["rps"] for r in slices[variant])
        server = statistics.median(r["server_ms"] for r in slices[variant])
        postgres = statistics.median(r["postgres_ms"] for r in slices[variant])
        left = statistics.median(r["left"] for r in slices[variant])
        line = f"{variant:<10}{rps:>16.1f}{server:>15.2f}{postgres:>17.2f}{left:>12.1%}"
        if variant == "otel":
            print(line + f"{1.0:>18.2f}")
            continue
        share = statistics.median(shares[variant])
        quartiles = (
            statistics.quantiles(shares[variant], n=4)
            if len(shares[variant]) > 1
            else [share, share, share]
        )
        line += f"{share:>18.2f}{quartiles[0]:>15.2f} to {quartiles[2]:.2f}"
        target = TARGETS.get(variant)
        if target is not None:
            verdict = "OK" if share >= target else "MISSED"
            missed += verdict == "MISSED"
            line += f"  target >= {target:.2f}: {verdict}"
        print(line)
    problems = [
        f"{variant}: {problem}"
        for variant, ledger in ledgers.items()
        if (problem := _ledger_problem(ledger)) is not None
    ]
    for problem in problems:
        print(f"ledger: {problem}")
    drops = {
        variant: sum(ledger["dropped"].values()) for variant, ledger in ledgers.items() if ledger
    }
    print(f"dropped (counted): {drops}")
    if missed or problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
