"""``recalltrace collect``: an OTLP/HTTP traces receiver that stores the RAG requests it sees.

``POST /v1/traces`` takes OTLP protobuf (``application/x-protobuf``) or JSON
(``application/json``), optionally gzip-compressed. The spans are grouped per trace and turned
into trace records by the same code as the in-process span processor; the records go through
the tracer's sampling, scrubbing, bounded queue and writer.

- A trace's requests are built half a second after its root span (no parent) arrived with no
  newer span, or, for a trace whose root is never sent here, after ``--trace-idle`` seconds
  without a new span.
- Back pressure: while the writer's queue is full, requests are answered ``503`` with
  ``Retry-After`` (what OTLP exporters retry) instead of being held in memory.
- Partial success: spans that cannot be read (ids of the wrong length) are rejected and counted
  in the response's ``partial_success``, with a message.
- At start, before it listens: a database with no recalltrace tables (fresh) gets them, as the
  tracer gives them by default; one at another schema revision, or where the tables cannot be
  created, is refused in one line naming ``recalltrace db upgrade`` (exit 2), so that nothing
  is answered 200 that could not be stored. A server that does not answer is waited for up to
  ``--database-wait`` seconds, as ``recalltrace worker`` does.
- Bound to 127.0.0.1 unless ``--listen`` says otherwise; ``--token`` (or
  ``$RECALLTRACE_COLLECT_TOKEN``) requires ``Authorization: Bearer <token>`` (else ``401``).
- Bounded: bodies, connections, requests read at once and JSON nesting (see
  :mod:`recalltrace._collect_server`), spans per trace and spans held (:class:`TraceBuffer`);
  SIGTERM or SIGINT exits within ``--stop-timeout`` seconds, after storing what was answered
  200 or counting what could not be.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from recalltrace._collect_server import (
    CollectServer,
    Export,
    Limits,
    MiB,
    Refused,
    start,
)
from recalltrace.cli._args import (
    DATABASE_WAIT_S,
    EXIT_OK,
    CommandError,
    check_sqlite_target,
    wait_for_database,
)
from recalltrace.tracer._span_views import decode_request, encode_response, span_views

logger = logging.getLogger(__name__)

TOKEN_ENV = "RECALLTRACE_COLLECT_TOKEN"
# Seconds a trace whose root span arrived waits for late spans (exporters send spans
# separately, and a child may arrive after its parent).
ROOT_SETTLE = 0.5
# resourceSpans[ { scopeSpans[ { spans[ { attributes[ { value{ : the nesting of an attribute.
MIN_DEPTH = 10


def register(sub: Any) -> None:
    """Add the ``collect`` subcommand."""
    parser = sub.add_parser(
        "collect",
        help="receive OTLP/HTTP traces and store the RAG requests in them",
        description="Receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON, gzip) and "
        "store the RAG requests they hold (OpenInference, GenAI and OpenLLMetry spans).",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:4318",
        help="address to listen on (default: 127.0.0.1:4318, loopback only; port 0 picks one)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="where records are stored; a database with no recalltrace tables gets them at "
        "start, an older schema is refused (default: $RECALLTRACE_DATABASE_URL, else SQLite)",
    )
    parser.add_argument(
        "--database-wait",
        type=_non_negative,
        default=DATABASE_WAIT_S,
        metavar="S",
        help="at start, wait this long for a database server that does not answer (starting, "
        "restarting), saying so once a minute, then exit 2; a database that answers but "
        f"refuses (no such database, wrong password) exits 2 at once (default {DATABASE_WAIT_S:g})",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"require 'Authorization: Bearer TOKEN' (default: ${TOKEN_ENV} when set)",
    )
    parser.add_argument(
        "--app-name", default=None, help="app name of every record (default: from the spans)"
    )
    parser.add_argument(
        "--trace-idle",
        type=_positive,
        default=5.0,
        metavar="S",
        help="build a trace whose root span never arrives after S seconds without a new span "
        "(default: 5)",
    )
    parser.add_argument(
        "--max-open-traces",
        type=_whole,
        default=10_000,
        metavar="N",
        help="traces held while waiting for their root span; past it the oldest is dropped "
        "and counted (default: 10000)",
    )
    bounds = parser.add_argument_group("bounds (see docs/ingest.md)")
    bounds.add_argument(
        "--max-spans-per-trace",
        type=_whole,
        default=5_000,
        metavar="N",
        help="spans held per trace; later ones are left out and counted (default: 5000)",
    )
    bounds.add_argument(
        "--max-buffer-mb",
        type=_positive,
        default=128.0,
        metavar="MB",
        help="spans held for all open traces, counted at their size in the body plus "
        f"{SPAN_OVERHEAD} bytes each; past it the oldest trace is dropped and counted "
        "(default: 128)",
    )
    bounds.add_argument(
        "--max-body-mb",
        type=_positive,
        default=32.0,
        metavar="MB",
        help="largest body, chunked or not, also once decompressed; larger is 413 (default: 32)",
    )
    bounds.add_argument(
        "--max-concurrent",
        type=_whole,
        default=4,
        metavar="N",
        help="requests read at once (one decoded at a time); another waits up to 1 s, then "
        "is answered 503 with Retry-After (default: 4)",
    )
    bounds.add_argument(
        "--max-connections",
        type=_whole,
        default=256,
        metavar="N",
        help="open connections; past it an idle one is closed, or the new one answered 503 "
        "(default: 256)",
    )
    bounds.add_argument(
        "--idle-timeout",
        type=_positive,
        default=30.0,
        metavar="S",
        help="close a connection with no request under way after S seconds (default: 30)",
    )
    bounds.add_argument(
        "--read-timeout",
        type=_positive,
        default=30.0,
        metavar="S",
        help="a request's line, headers and body must arrive within S seconds, else its "
        "connection is closed (default: 30)",
    )
    bounds.add_argument(
        "--max-depth",
        type=_whole,
        default=64,
        metavar="N",
        help="deepest nesting of arrays and objects in a JSON body; deeper is 400 (default: 64)",
    )
    bounds.add_argument(
        "--stop-timeout",
        type=_positive,
        default=10.0,
        metavar="S",
        help="on SIGTERM or SIGINT, exit within S seconds: requests under way get half of it, "
        "storing what was answered 200 the rest (default: 10)",
    )
    parser.set_defaults(handler=run_collect)


def _whole(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {raw!r}")
    return value


def _positive(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {raw!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {raw!r}")
    return value


def _non_negative(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {raw!r}")
    return value


def parse_listen(raw: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a pair; ``CommandError`` otherwise."""
    host, sep, port = raw.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise CommandError(f"--listen expects HOST:PORT, e.g. 127.0.0.1:4318, not {raw!r}")
    return host, int(port)


# -- grouping ---------------------------------------------------------------------------------

# What a held span is counted as besides its share of the body it came in: the Python objects
# of a span with a handful of attributes.
SPAN_OVERHEAD = 600


class _OpenTrace:
    __slots__ = ("ids", "rooted", "spans", "touched", "weight")

    def __init__(self, now: float) -> None:
        self.touched = now
        self.spans: list[Any] = []
        self.ids: set[int] = set()
        self.rooted = False
        self.weight = 0


class TraceBuffer:
    """Spans waiting for their trace's root span, bounded in traces, in spans per trace, in
    bytes held and in time."""

    def __init__(
        self,
        assembler: Any,
        idle: float,
        max_open_traces: int,
        max_spans_per_trace: int = 5_000,
        max_bytes: int = 128 * MiB,
    ) -> None:
        self.assembler = assembler
        self.idle = idle
        self.max_open_traces = max_open_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.max_bytes = max_bytes
        self._traces: dict[int, _OpenTrace] = {}
        self._lock = threading.Lock()
        self.held = 0
        self.evicted = 0
        self.left_out = 0
        self.duplicates = 0
        self.requests = 0
        self.backlog = 0
        self._said: set[str] = set()

    def add(self, views: list[Any], size: int = 0) -> None:
        """Buffer ``views`` (from a body of ``size`` bytes; :meth:`sweep` builds the traces
        that are complete). A span past ``max_spans_per_trace``, or whose id its trace holds
        already (an export sent twice), is left out and does not keep its trace open."""
        if not views:
            return
        weight = size // len(views) + SPAN_OVERHEAD
        evicted = left_out = duplicates = 0
        now = time.monotonic()
        with self._lock:
            for view in views:
                trace = self._traces.get(view.trace_id)
                if trace is None:
                    while len(self._traces) >= self.max_open_traces:
                        self._drop_oldest()
                        evicted += 1
                    trace = self._traces[view.trace_id] = _OpenTrace(now)
                if view.span_id in trace.ids:
                    duplicates += 1
                    continue
                if len(trace.spans) >= self.max_spans_per_trace:
                    left_out += 1
                    continue
                trace.spans.append(view)
                trace.ids.add(view.span_id)
                trace.touched = now
                trace.weight += weight
                trace.rooted = trace.rooted or view.parent_id is None
                self.held += weight
            while self.held > self.max_bytes and self._traces:
                self._drop_oldest()
                evicted += 1
            self.evicted += evicted
            self.left_out += left_out
            self.duplicates += duplicates
        self._count(
            "capture_evicted",
            evicted,
            "recalltrace collect: %d trace(s) pushed out by --max-open-traces or --max-buffer-mb "
            "before their root span arrived: not stored (said once; the total is printed at exit)",
        )
        self._count(
            "capture_spans",
            left_out,
            "recalltrace collect: %d span(s) past --max-spans-per-trace left out of their trace "
            "(said once; the total is printed at exit)",
        )

    def _drop_oldest(self) -> None:
        trace = self._traces.pop(next(iter(self._traces)))
        self.held -= trace.weight

    def _count(self, reason: str, count: int, message: str) -> None:
        if not count:
            return
        from recalltrace.tracer import _runtime

        _runtime.stats().drop(reason, "", count, report=False)
        if reason not in self._said:
            self._said.add(reason)
            logger.warning(message, count)

    def sweep(self, everything: bool = False, room: Callable[[int], bool] | None = None) -> int:
        """Build the traces idle for ``idle`` seconds (all of them with ``everything``) from
        the spans that arrived: each span whose parent never came is a top. Traces are built
        oldest first while ``room(pending)`` says the record queue can take one more besides
        the ``pending`` requests built and not yet offered; the others stay
        held for the next sweep (and :attr:`backlog` says how many). Returns the backlog."""
        now = time.monotonic()
        limit = now - self.idle
        settled = now - min(ROOT_SETTLE, self.idle)
        with self._lock:
            due = [
                trace_id
                for trace_id, trace in self._traces.items()
                if everything or trace.touched < limit or (trace.rooted and trace.touched < settled)
            ]
        left = len(due)
        # The requests of the traces built in this sweep are offered together (a few dozen at a
        # time), so that one request that two instrumentors sent as two traces is paired (see
        # offer_all).
        candidates: list[Any] = []
        for trace_id in due:
            if len(candidates) >= OFFER_BATCH:
                self.requests += self.assembler.offer_all(candidates)
                candidates = []
            if room is not None and not room(len(candidates)):
                break
            left -= 1
            with self._lock:
                trace = self._traces.pop(trace_id, None)
                if trace is None:
                    continue
                self.held -= trace.weight
            # Repeated spans were left out as they arrived (add); what two instrumentors sent of
            # one request is paired in offer_all.
            spans = trace.spans
            reached = 0
            for top, subtree in _subtrees(spans):
                reached += len(subtree)
                candidates.extend(self.assembler.requests_in(top, subtree))
            # Spans whose parents form a loop hang under no top: counted, not built.
            self._count(
                "capture_parent_loop",
                len(spans) - reached,
                "recalltrace collect: %d span(s) whose parent ids form a loop were left out "
                "(said once; the total is printed at exit)",
            )
        self.requests += self.assembler.offer_all(candidates)
        self.backlog = left
        return left

    def open_traces(self) -> int:
        with self._lock:
            return len(self._traces)


OFFER_BATCH = 32
"""Requests offered to the writer together by a sweep (see TraceBuffer.sweep)."""


def _subtrees(spans: list[Any]) -> Iterator[tuple[Any, list[Any]]]:
    """Each top span (its parent is not among ``spans``) with the spans under it; each span is
    in one subtree at most, so the whole costs one pass however the spans are shaped."""
    ids = {view.span_id for view in spans}
    children: dict[int, list[Any]] = {}
    for view in spans:
        if view.parent_id is not None and view.parent_id in ids:
            children.setdefault(view.parent_id, []).append(view)
    for top in spans:
        if top.parent_id is not None and top.parent_id in ids:
            continue
        subtree = [top]
        stack = [top]
        while stack:
            for child in children.pop(stack.pop().span_id, ()):
                subtree.append(child)
                stack.append(child)
        yield top, subtree


# -- the receiver -----------------------------------------------------------------------------


class Collector:
    """The receiver's state: the trace buffer, the writer's bound, the token."""

    def __init__(self, buffer: TraceBuffer, token: str | None) -> None:
        from recalltrace.tracer import _runtime

        self.buffer = buffer
        self.token = token
        self.runtime = _runtime.get()
        self.received = 0
        self.rejected = 0
        self.refused = 0
        self.accepted = 0
        self.refused_at_stop = 0
        self._gate = threading.Lock()
        self._closed = False

    def queue_full(self, pending: int = 0) -> bool:
        runtime = self.runtime
        return bool(runtime.writer.queue_size() + pending >= runtime.config.max_queue_size)

    def room(self, pending: int = 0) -> bool:
        """Whether the record queue can take another trace's records now, besides ``pending``
        requests built and about to be offered."""
        return not self.queue_full(pending)

    def busy(self) -> Refused | None:
        # Full queue, or complete traces waiting for room in it: what is answered 200 must
        # fit, so new exports wait (an exporter retries a 503 after Retry-After).
        if self.queue_full() or self.buffer.backlog:
            with self._gate:
                self.refused += 1
            return Refused(503, "the record queue is full; retry later", retry_after=2)
        return None

    def take(self, export: Export) -> tuple[int, bytes, str]:
        content_type = export.content_type
        try:
            request = decode_request(export.body, content_type)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        views, rejected, reason = span_views(request)
        del request
        with self._gate:
            # Taken and answered 200 only while the final build has not started.
            if self._closed:
                self.refused_at_stop += 1
                raise Refused(503, "the receiver is stopping; retry later", retry_after=1)
            self.received += len(views)
            self.rejected += rejected
            self.buffer.add(views, len(export.body))
            self.accepted += 1
        return 200, encode_response(rejected, reason, content_type), content_type

    def close(self) -> None:
        """Take nothing more (exports still under way are answered 503)."""
        with self._gate:
            self._closed = True


def serve(
    host: str,
    port: int,
    *,
    token: str | None = None,
    app_name: str | None = None,
    trace_idle: float = 5.0,
    max_open_traces: int = 10_000,
    max_spans_per_trace: int = 5_000,
    max_buffer: int = 128 * MiB,
    limits: Limits | None = None,
) -> tuple[CollectServer, Collector]:
    """Start the receiver on daemon threads (the tracer must be configured); returns the
    server (``server_address`` holds the port) and its state."""
    from recalltrace.tracer._assembler import RequestAssembler

    buffer = TraceBuffer(
        RequestAssembler(app_name), trace_idle, max_open_traces, max_spans_per_trace, max_buffer
    )
    collector = Collector(buffer, token)
    server, _ = start(host, port, collector, limits or Limits())
    return server, collector


def _check(args: argparse.Namespace) -> None:
    """One line naming the first option out of its range."""
    if args.max_depth < MIN_DEPTH:
        raise CommandError(
            f"--max-depth must be at least {MIN_DEPTH} (an OTLP/JSON body nests that deep "
            f"before any attribute), not {args.max_depth}"
        )
    if args.max_body_mb * MiB < 1024:
        raise CommandError(f"--max-body-mb must allow at least 1 KiB, not {args.max_body_mb}")
    if args.max_connections < args.max_concurrent:
        raise CommandError(
            f"--max-connections ({args.max_connections}) must be at least --max-concurrent "
            f"({args.max_concurrent})"
        )


def prepare_database(url: str, wait: float) -> bool:
    """Before ``collect`` listens: the database at ``url`` answers and holds the schema this
    version writes. A database with no recalltrace tables gets them (under the migration lock,
    as the tracer does by default); returns whether it did. Refused in one line
    (``CommandError``): a SQLite file that is not one or holds another application's tables, a
    server that refuses the URL, or does not answer within ``wait`` seconds, tables that cannot
    be created, a schema at another revision. Every line that names ``recalltrace db upgrade``
    gives the URL, its password hidden."""
    from recalltrace.storage.db import create_engine_from_url, redact_url
    from recalltrace.storage.errors import is_database_unavailable
    from recalltrace.storage.migrate import (
        MigrationLocked,
        create_schema_if_missing,
        current_revision_of,
        head_revision,
        is_known_revision,
    )

    shown = redact_url(url)
    upgrade = f"`recalltrace db upgrade --database-url {shlex.quote(shown)}`"
    check_sqlite_target(url, creating=True)
    sqlite = url.startswith("sqlite")
    if not sqlite:
        wait_for_database(
            url, wait, who="collect", create_hint="or create the database: collect adds its tables"
        )
    engine = create_engine_from_url(url)
    try:
        try:
            created = create_schema_if_missing(engine)
        except MigrationLocked as exc:
            raise CommandError(f"{shown}: {exc}; collect did not start") from None
        except Exception as exc:
            detail = _first_line(exc)
            if sqlite:
                raise CommandError(
                    f"cannot open or write the SQLite database {shown} ({detail}): check "
                    "--database-url and that this user may write the file and its folder"
                ) from None
            if is_database_unavailable(exc):
                raise CommandError(
                    f"cannot reach the database at {shown} ({detail}); collect did not start"
                ) from None
            raise CommandError(
                f"cannot create the recalltrace tables in the empty database {shown} ({detail}): "
                f"run {upgrade} as a role that may create tables, then start collect again"
            ) from None
        current = current_revision_of(engine)
    finally:
        engine.dispose()
    head = head_revision()
    if current == head:
        return created
    if current is None:
        raise CommandError(
            f"{shown} holds some recalltrace tables but no schema revision (they were not made "
            "by `recalltrace db upgrade`): collect leaves them alone; check --database-url"
        )
    if not is_known_revision(current):
        raise CommandError(
            f"{shown} is at schema revision {current}, newer than this recalltrace knows (it "
            f"needs {head}): upgrade recalltrace, then start collect again"
        )
    raise CommandError(
        f"{shown} is at schema revision {current}, this recalltrace needs {head}: run "
        f"{upgrade}, then start collect again"
    )


def _first_line(exc: BaseException) -> str:
    """``exc`` in one line: its class, and its driver's message when there is one."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = " ".join((text.splitlines() or [""])[0].split())[:300]
    name = type(orig if orig is not None else exc).__name__
    return f"{name}: {first}" if first else name


def run_collect(args: argparse.Namespace) -> int:
    """Run the receiver until SIGTERM or SIGINT, then build what is buffered and drain."""
    import recalltrace
    from recalltrace.storage.db import redact_url, resolve_database_url

    host, port = parse_listen(args.listen)
    _check(args)
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)
    url = resolve_database_url(args.database_url)
    # Before READY: what is answered 200 must be storable (tables there, at this revision).
    if prepare_database(url, args.database_wait):
        print(
            f"collect: created the recalltrace tables in the empty database {redact_url(url)}",
            file=sys.stderr,
            flush=True,
        )
    from opentelemetry.sdk.trace import TracerProvider

    recalltrace.configure(
        database_url=url,
        tracer_provider=TracerProvider(),
        handle_signals=False,
        auto_migrate=False,
    )
    from recalltrace.tracer import _runtime

    # The tables were there at start; if they go, what to run is collect's own advice.
    _runtime.get().pipeline.schema_hint = (
        f"run `recalltrace db upgrade --database-url {shlex.quote(redact_url(url))}`"
    )
    limits = Limits(
        max_body=int(args.max_body_mb * MiB),
        max_concurrent=args.max_concurrent,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        read_timeout=args.read_timeout,
        max_depth=args.max_depth,
    )
    try:
        server, collector = serve(
            host,
            port,
            token=token,
            app_name=args.app_name,
            trace_idle=args.trace_idle,
            max_open_traces=args.max_open_traces,
            max_spans_per_trace=args.max_spans_per_trace,
            max_buffer=int(args.max_buffer_mb * MiB),
            limits=limits,
        )
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
    stop = threading.Event()

    signalled: list[float] = []

    def on_signal(signum: int, frame: Any) -> None:
        if not signalled:
            signalled.append(time.monotonic())
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    where = "" if token else " (no token: anyone who can reach it may send)"
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        where = " (not loopback and no token: anyone on the network may send)"
    print(f"READY http://{bound_host}:{bound_port}/v1/traces{where}", flush=True)
    while not stop.wait(0.5):
        collector.buffer.sweep(room=lambda pending: not stop.is_set() and collector.room(pending))
    # Stop: no new connections; requests under way get half of --stop-timeout to finish,
    # then what was answered 200 is built as the queue drains, and stored in the time left.
    started = signalled[0] if signalled else time.monotonic()
    deadline = started + args.stop_timeout
    cut_off = server.stop(started + args.stop_timeout / 2)
    collector.close()
    built_by = deadline - args.stop_timeout / 10  # the last tenth is for the last writes

    def room(pending: int) -> bool:
        return time.monotonic() < built_by and collector.room(pending)

    while collector.buffer.sweep(everything=True, room=room) and time.monotonic() < built_by:
        time.sleep(0.02)
    done = recalltrace.shutdown(max(0.0, deadline - time.monotonic()))
    print(summary(collector, server, cut_off), file=sys.stderr, flush=True)
    return EXIT_OK if done and not collector.buffer.open_traces() else 1


def summary(collector: Collector, server: CollectServer, cut_off: int) -> str:
    """The one line said at exit: what was received, taken, refused and not stored."""
    from recalltrace.tracer import _runtime

    buffer = collector.buffer
    dropped = _runtime.stats().snapshot()["dropped"]
    reasons: dict[str, int] = {}
    for (reason, _), count in dropped.items():
        reasons[reason] = reasons.get(reason, 0) + count
    # capture_* reasons count spans and traces that made no record (said above or at once);
    # the others count records built and then not stored.
    lost = {r: n for r, n in reasons.items() if not r.startswith("capture_")}
    not_stored = ", ".join(f"{reason} {count}" for reason, count in sorted(lost.items()))
    skipped = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()) if r not in lost)
    refusals = ", ".join(f"{what} {count}" for what, count in sorted(server.counts.items()))
    return (
        f"collect: {collector.accepted} export(s) answered 200, {collector.received} span(s) "
        f"received, {collector.rejected} rejected, {buffer.requests} request(s) found, "
        f"{collector.refused} export(s) refused while the queue was full, {buffer.evicted} "
        f"trace(s) evicted, {buffer.left_out} span(s) past --max-spans-per-trace left out, "
        f"{buffer.duplicates} duplicate span(s) ignored, {cut_off} request(s) cut off at stop, "
        f"{collector.refused_at_stop} refused at stop, {buffer.open_traces()} trace(s) "
        f"answered 200 not built before --stop-timeout; records not stored: "
        f"{sum(lost.values())} ({not_stored or 'none'}); not built: {skipped or 'none'}; "
        f"answers: {refusals or 'none'}"
    )
