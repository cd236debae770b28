"""Spans per second turned into trace records, in process and over OTLP.

- **Span processor**: one OpenInference-style request (a ``CHAIN`` root, a ``RETRIEVER`` with
  10 documents of 300 characters of words, with ids and scores, an ``LLM`` span) written by
  hand with the SDK, on a provider whose BatchSpanProcessor discards; with and without
  ``SpanCapture`` (``configure(capture_spans=True)``, records assembled and scrubbed on the
  writer thread and handed to a discarding sink), in 40 rounds of two interleaved blocks of 250
  requests (``--blocks``; the ratio is the median of the rounds' own). Measured per request:
  the application thread's CPU time (the request path; target: at most 1.2x the bare SDK's),
  the wall time, and, on their own thread clocks, the CPU recalltrace's threads spend per
  stored record (finding the request, assembling, scrubbing), so that work is charged to no
  block and is reported on its own.
- **collect**: ``recalltrace collect`` in its own process, storing into a scratch SQLite file;
  the same requests are sent as OTLP protobuf batches by one client over HTTP; spans per
  second from the first request to the last record stored (the receiver's drain included).
- **Phoenix** (the peer): ``phoenix serve`` (Arize Phoenix, on its default SQLite storage) is
  sent the same OTLP bodies at its ``/v1/traces``; spans per second from the first request to
  the last span stored (counted through its GraphQL API). Phoenix needs SQLAlchemy 2.1 and
  lives in an environment of its own: ``--phoenix PATH`` names its ``phoenix`` command (default:
  the one the tests install under ``~/.cache/recalltrace-tests``).

Run: ``python -m benchmarks.ingest [--requests 5000] [--batch 100] [--sample-rate 1]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import recalltrace
from benchmarks.tracer_overhead import document_text

DOCUMENTS = 10
DOCUMENT_CHARS = 300
SPANS_PER_REQUEST = 3


class DiscardingExporter(SpanExporter):
    """Accepts spans and drops them (and keeps the last batch for the OTLP run)."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self.keep = False

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if self.keep:
            self.kept.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class DiscardingSink:
    def __init__(self) -> None:
        self.written = 0

    def write_traces(self, records: Sequence[Any]) -> None:
        self.written += len(records)

    def attach_reference(self, update: Any) -> int:
        raise LookupError(update.trace_id)


BLOCK_REQUESTS = 250
"""Requests per in-process block."""
REQUEST_PATH_TARGET = 1.20
"""The application thread's CPU per request with SpanCapture, at most this times the bare SDK's."""

CONTENTS = [document_text(doc, DOCUMENT_CHARS) for doc in range(DOCUMENTS)]


def one_request(tracer: Any, index: int) -> None:
    with tracer.start_as_current_span("answer") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", f"question {index}?")
        with tracer.start_as_current_span("search") as retriever:
            retriever.set_attribute("openinference.span.kind", "RETRIEVER")
            for doc in range(DOCUMENTS):
                prefix = f"retrieval.documents.{doc}.document."
                retriever.set_attribute(prefix + "id", f"doc-{doc}")
                retriever.set_attribute(prefix + "content", CONTENTS[doc])
                retriever.set_attribute(prefix + "score", 1.0 - doc / 100)
        with tracer.start_as_current_span("generate") as llm:
            llm.set_attribute("openinference.span.kind", "LLM")
            llm.set_attribute("output.value", "an answer")
            llm.set_attribute("llm.token_count.prompt", 100)
        root.set_attribute("output.value", "an answer")


def _background_cpu() -> dict[int, float]:
    """CPU seconds used so far by each of recalltrace's own threads (writer, reader)."""
    used: dict[int, float] = {}
    for thread in threading.enumerate():
        if thread.name.startswith("recalltrace-") and thread.ident is not None:
            try:
                clock = time.pthread_getcpuclockid(thread.ident)
                used[thread.ident] = time.clock_gettime(clock)
            except (OSError, AttributeError):
                continue
    return used


def in_process(requests: int, blocks: int, rate: float) -> dict[str, float]:
    """Per request: wall time and the application thread's CPU time, bare and with
    SpanCapture, in interleaved blocks; and the CPU recalltrace's own threads spent per
    stored record (measured on their thread clocks, so it is charged to no block)."""
    bare_provider = TracerProvider()
    bare_provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
    captured_provider = TracerProvider()
    captured_provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
    sink = DiscardingSink()
    recalltrace.configure(
        tracer_provider=captured_provider,
        capture_spans=True,
        sink=sink,
        handle_signals=False,
        max_queue_size=1_000_000,
        sample_rate=rate,
    )
    tracers = {
        "bare SDK": bare_provider.get_tracer("bench"),
        "with SpanCapture": captured_provider.get_tracer("bench"),
    }
    per_block = max(requests // blocks, 1)
    wall: dict[str, list[float]] = {name: [] for name in tracers}
    cpu: dict[str, list[float]] = {name: [] for name in tracers}
    for tracer in tracers.values():  # warm-up
        for index in range(200):
            one_request(tracer, index)
    recalltrace.flush(120)
    warm_records = sink.written
    background_before = _background_cpu()
    order = list(tracers.items())
    for _ in range(blocks):
        for name, tracer in order:
            started, started_cpu = time.perf_counter(), time.thread_time()
            for index in range(per_block):
                one_request(tracer, index)
            cpu[name].append((time.thread_time() - started_cpu) / per_block)
            wall[name].append((time.perf_counter() - started) / per_block)
        order.reverse()  # bare first, then captured first: neither always runs second
    flushed_at = time.perf_counter()
    recalltrace.flush(120)
    drain = time.perf_counter() - flushed_at
    background = sum(
        used - background_before.get(ident, 0.0) for ident, used in _background_cpu().items()
    )
    stored = sink.written - warm_records
    bare, captured = (
        statistics.median(wall["bare SDK"]),
        statistics.median(wall["with SpanCapture"]),
    )
    bare_cpu = statistics.median(cpu["bare SDK"])
    captured_cpu = statistics.median(cpu["with SpanCapture"])
    # The ratios are the medians of each round's own ratio: the machine's speed drifts (by
    # up to 1.7x between seconds on a shared host), and a round's two blocks run side by side.
    cpu_ratio = statistics.median(
        c / b for c, b in zip(cpu["with SpanCapture"], cpu["bare SDK"], strict=True)
    )
    wall_ratio = statistics.median(
        c / b for c, b in zip(wall["with SpanCapture"], wall["bare SDK"], strict=True)
    )
    writer_per_record = background / stored if stored else 0.0
    measured = per_block * blocks
    total_cpu = captured_cpu + background / measured
    return {
        "bare_us": bare * 1e6,
        "captured_us": captured * 1e6,
        "ratio": wall_ratio,
        "bare_cpu_us": bare_cpu * 1e6,
        "captured_cpu_us": captured_cpu * 1e6,
        "cpu_ratio": cpu_ratio,
        "writer_us_per_record": writer_per_record * 1e6,
        "total_cpu_ratio": total_cpu / bare_cpu,
        "spans_per_s": SPANS_PER_REQUEST / captured,
        "records": float(sink.written),
        "expected": float(200 + measured),
        "drain_s": drain,
    }


def otlp_batches(requests: int, batch: int) -> list[bytes]:
    """The requests as OTLP protobuf bodies of ``batch`` requests each, encoded by the SDK's
    own OTLP encoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    exporter = DiscardingExporter()
    provider = TracerProvider()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider.add_span_processor(SimpleSpanProcessor(exporter))
    exporter.keep = True
    tracer = provider.get_tracer("bench")
    bodies = []
    for start in range(0, requests, batch):
        exporter.kept.clear()
        for index in range(start, min(start + batch, requests)):
            one_request(tracer, index)
        bodies.append(bytes(encode_spans(exporter.kept).SerializeToString()))
    return bodies


def over_otlp(requests: int, batch: int) -> dict[str, float]:
    bodies = otlp_batches(requests, batch)
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/ingest.db"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
        env["RECALLTRACE_MAX_QUEUE_SIZE"] = str(requests + 10)
        env["RECALLTRACE_SHUTDOWN_TIMEOUT"] = "300"
        command = [sys.executable, "-m", "recalltrace", "collect", "--listen", "127.0.0.1:0"]
        process = subprocess.Popen(
            [*command, "--database-url", url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        endpoint = process.stdout.readline().split()[1]
        started = time.perf_counter()
        refused = 0
        for body in bodies:
            while True:
                request = urllib.request.Request(
                    endpoint, data=body, headers={"Content-Type": "application/x-protobuf"}
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        response.read()
                    break
                except urllib.error.HTTPError as error:
                    if error.code != 503:
                        raise
                    refused += 1
                    time.sleep(0.2)
        sent = time.perf_counter() - started
        process.terminate()
        _, summary = process.communicate(timeout=300)
        elapsed = time.perf_counter() - started
        from sqlalchemy import create_engine, text

        engine = create_engine(url)
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM traces")).scalar_one()
        engine.dispose()
    return {
        "send_s": sent,
        "elapsed_s": elapsed,
        "spans_per_s": requests * SPANS_PER_REQUEST / elapsed,
        "records": float(stored),
        "refused": float(refused),
        "summary": summary.strip().splitlines()[-1] if summary.strip() else "",  # type: ignore[dict-item]
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _phoenix_spans(base: str) -> int:
    import json

    query = {"query": "{ projects { edges { node { name recordCount } } } }"}
    request = urllib.request.Request(
        base + "/graphql",
        data=json.dumps(query).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        edges = json.loads(response.read())["data"]["projects"]["edges"]
    return sum(int(edge["node"]["recordCount"]) for edge in edges)


def phoenix_peer(requests: int, batch: int, executable: str) -> dict[str, float]:
    """The same OTLP bodies sent to Phoenix's receiver; timed until Phoenix stored them."""
    bodies = otlp_batches(requests, batch)
    expected = requests * SPANS_PER_REQUEST
    with tempfile.TemporaryDirectory() as folder:
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
        env.update(
            PHOENIX_WORKING_DIR=folder,
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(port),
            PHOENIX_GRPC_PORT=str(_free_port()),
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        process = subprocess.Popen(
            [executable, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise RuntimeError("Phoenix did not start") from None
                    time.sleep(0.5)
            started = time.perf_counter()
            for body in bodies:
                request = urllib.request.Request(
                    base + "/v1/traces",
                    data=body,
                    headers={"Content-Type": "application/x-protobuf"},
                )
                with urllib.request.urlopen(request, timeout=60) as response:
                    response.read()
            sent = time.perf_counter() - started
            stored = 0
            give_up = time.monotonic() + 900
            while stored < expected and time.monotonic() < give_up:
                time.sleep(1.0)  # polled gently: the count is a query Phoenix also serves
                stored = _phoenix_spans(base)
            elapsed = time.perf_counter() - started
        finally:
            process.terminate()
            process.wait(60)
    return {
        "send_s": sent,
        "elapsed_s": elapsed,
        "spans_per_s": stored / elapsed,
        "stored": float(stored),
        "expected": float(expected),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=5000, help="requests sent to collect and to Phoenix"
    )
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--blocks",
        type=int,
        default=40,
        help="rounds of two in-process blocks of 250 requests (a block's CPU time swings with "
        "the garbage collector's and the writer thread's passes; 40 rounds keep the median "
        "steady)",
    )
    parser.add_argument(
        "--sample-rate",
        type=float,
        default=1.0,
        help="share of requests stored (0: the span processor's request-path cost alone)",
    )
    parser.add_argument("--skip-collect", action="store_true")
    parser.add_argument(
        "--phoenix",
        default=os.path.expanduser("~/.cache/recalltrace-tests/phoenix-20/bin/phoenix"),
        help="the phoenix command of an Arize Phoenix installation (the peer)",
    )
    parser.add_argument("--skip-phoenix", action="store_true")
    args = parser.parse_args()
    local = in_process(args.blocks * BLOCK_REQUESTS, args.blocks, args.sample_rate)
    print(
        f"span processor (sample rate {args.sample_rate:g}), per request:\n"
        f"  request path, application thread CPU: bare SDK {local['bare_cpu_us']:.1f} us, "
        f"with SpanCapture {local['captured_cpu_us']:.1f} us, ratio {local['cpu_ratio']:.2f} "
        f"(target <= {REQUEST_PATH_TARGET:.2f})\n"
        f"  wall time: bare SDK {local['bare_us']:.1f} us, with SpanCapture "
        f"{local['captured_us']:.1f} us, ratio {local['ratio']:.2f} "
        f"({local['spans_per_s']:,.0f} spans/s on one core)\n"
        f"  recalltrace's threads (assembling, scrubbing, writing): "
        f"{local['writer_us_per_record']:.1f} us CPU per stored record; request path and "
        f"those together: {local['total_cpu_ratio']:.2f}x the bare SDK's CPU\n"
        f"  {local['records']:.0f} of {local['expected']:.0f} records written "
        f"(writer drained {local['drain_s']:.2f} s after the last request)"
    )
    # A missed target fails the run (checked at the end, after every figure is printed).
    lost = args.sample_rate >= 1 and local["records"] < local["expected"]
    missed = local["cpu_ratio"] > REQUEST_PATH_TARGET or lost
    if args.skip_collect:
        raise SystemExit(1 if missed else 0)
    remote = over_otlp(args.requests, args.batch)
    print(
        f"collect: {args.requests} requests ({args.requests * SPANS_PER_REQUEST} spans) in "
        f"batches of {args.batch}: sent in {remote['send_s']:.2f} s, stored in "
        f"{remote['elapsed_s']:.2f} s: {remote['spans_per_s']:,.0f} spans/s; "
        f"{remote['records']:.0f} records stored, {remote['refused']:.0f} batches refused "
        f"(503) and resent\n  {remote['summary']}"
    )
    missed = missed or remote["records"] < args.requests
    if args.skip_phoenix:
        raise SystemExit(1 if missed else 0)
    if not os.path.exists(args.phoenix):
        print(f"Phoenix: not measured ({args.phoenix} does not exist; see --phoenix)")
        raise SystemExit(1 if missed else 0)
    peer = phoenix_peer(args.requests, args.batch, args.phoenix)
    print(
        f"Phoenix: the same batches sent in {peer['send_s']:.2f} s, stored in "
        f"{peer['elapsed_s']:.2f} s: {peer['spans_per_s']:,.0f} spans/s "
        f"({peer['stored']:.0f} of {peer['expected']:.0f} spans stored)\n"
        f"collect / Phoenix: {remote['spans_per_s'] / peer['spans_per_s']:.2f}x (target >= 3)"
    )
    missed = missed or remote["spans_per_s"] / peer["spans_per_s"] < 3
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
