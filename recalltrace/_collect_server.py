"""The HTTP side of ``recalltrace collect``: connections, bodies and their bounds.

What one sender can make the receiver hold is bounded by :class:`Limits`:

- ``max_connections`` connections (a thread each); past it an idle keep-alive connection is
  closed to make room, and when none is idle the new one is answered ``503``.
- ``idle_timeout``: a connection with no request under way is closed after that many seconds.
- ``read_timeout``: a request whose line, headers and body have not all arrived after that many
  seconds has its connection closed.
- ``max_concurrent`` requests read at once (one of them decoded at a time); a request waits up
  to ``busy_wait`` seconds for its turn, then is answered ``503`` with ``Retry-After``.
- ``max_body`` bytes per body, checked while it is read (``Content-Length``, or each chunk of a
  chunked body) and again once decompressed: ``413``; a malformed chunked body is ``400``.
- ``max_depth`` levels of nesting in a JSON body: ``400``.
- 64 KiB of header lines per request: ``431``.

Every refusal is a status an OTLP exporter understands, with a one-line JSON message; every
problem, a client gone mid-body included, is logged as one line and never as a traceback.
:meth:`CollectServer.stop` stops accepting, lets the requests under way finish until a
deadline, then closes what is left.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from recalltrace.tracer._span_views import OTLP_JSON

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
PROTOBUF = "application/x-protobuf"
JSON = OTLP_JSON
_CHUNK_LINE = 1024  # bytes of a chunk-size line, extensions included
_TRAILERS = 64  # trailer lines after the last chunk
_HEADER_BYTES = 64 * 1024  # all the header lines of one request
_PIECE = 256 * 1024  # bytes read from the socket at a time
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
# A JSON string literal (escapes included): removed before brackets are counted.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


@dataclass(frozen=True)
class Limits:
    """The bounds of the receiver (see the module's docstring)."""

    max_body: int = 32 * MiB
    max_concurrent: int = 4
    max_connections: int = 256
    idle_timeout: float = 30.0
    read_timeout: float = 30.0
    max_depth: int = 64
    busy_wait: float = 1.0


class Refused(Exception):
    """A request answered with an error status instead of being taken."""

    def __init__(
        self, status: int, message: str, *, close: bool = False, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.retry_after = retry_after


class Gone(Exception):
    """The client closed the connection, or stopped sending, before its body was read."""


@dataclass
class Export:
    """One body, read whole, decompressed and checked, for the receiver to take."""

    body: bytes
    content_type: str


class Receiver(Protocol):
    """What the server hands bodies to (``recalltrace collect``'s state)."""

    token: str | None

    def busy(self) -> Refused | None:
        """A refusal to answer before the body is read (e.g. a full record queue), or None."""
        ...

    def take(self, export: Export) -> tuple[int, bytes, str]:
        """Decode and keep ``export``; the status, body and content type of the answer.
        Raises :class:`Refused` for a body that cannot be taken."""
        ...


class _Connection:
    """One accepted connection: its socket and whether a request is under way on it."""

    __slots__ = ("reading_since", "sock", "state")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.state = "idle"  # idle, reading (line, headers, body), working (decoding, answering)
        self.reading_since = 0.0

    def close(self) -> None:
        """Wake the thread serving it (a blocked read returns) so that it ends."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class CollectServer(ThreadingHTTPServer):
    """A threading HTTP server with bounded connections, reads and decoding."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], receiver: Receiver, limits: Limits) -> None:
        self.receiver = receiver
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_concurrent)
        self.decoding = threading.Lock()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._connections: dict[socket.socket, _Connection] = {}
        self._stopping = False
        self._stopped = threading.Event()
        self.counts: dict[str, int] = {}
        super().__init__(address, _handler_class(limits))

    # -- counting -----------------------------------------------------------------------------

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + n

    # -- connections --------------------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        sock: socket.socket = request
        limit = self.limits.max_connections
        with self._changed:
            if len(self._connections) >= limit and not self._stopping:
                # Make room by closing an idle keep-alive connection (its client reconnects
                # when it needs to), and wait for its thread to end.
                idle = next((c for c in self._connections.values() if c.state == "idle"), None)
                if idle is not None:
                    idle.state = "closing"
                    idle.close()
                    self._changed.wait_for(lambda: len(self._connections) < limit, timeout=1.0)
            stopping = self._stopping
            room = len(self._connections) < limit
            if room and not stopping:
                self._connections[sock] = _Connection(sock)
        if stopping or not room:
            self.count("connections refused")
            _refuse_connection(sock, stopping)
            return
        super().process_request(request, client_address)

    def connection(self, sock: socket.socket) -> _Connection:
        with self._lock:
            return self._connections[sock]

    def set_state(self, conn: _Connection, state: str) -> None:
        with self._lock:
            if conn.state == "closing":
                return
            if state == "reading" and conn.state != "reading":
                conn.reading_since = time.monotonic()
            conn.state = state
            stopping = self._stopping
        if stopping and state == "idle":
            conn.close()

    def stopping(self) -> bool:
        with self._lock:
            return self._stopping

    def shutdown_request(self, request: Any) -> None:
        with self._changed:
            self._connections.pop(request, None)
            self._changed.notify_all()
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line instead of the standard library's traceback."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            self.count("connections lost")
            logger.debug("recalltrace collect: connection from %s lost: %s", client_address, exc)
            return
        self.count("errors")
        logger.error(
            "recalltrace collect: %s on a connection from %s: %s",
            type(exc).__name__,
            client_address[0] if isinstance(client_address, tuple) else client_address,
            exc,
        )

    # -- watchdog and stop ---------------------------------------------------------------------

    def watch(self, every: float = 0.25) -> threading.Thread:
        """Start the thread that closes connections whose request is not read in time."""

        def run() -> None:
            while not self._stopped.wait(every):
                self._close_slow_readers()

        thread = threading.Thread(target=run, name="recalltrace-collect-watch", daemon=True)
        thread.start()
        return thread

    def _close_slow_readers(self) -> None:
        limit = time.monotonic() - self.limits.read_timeout
        with self._lock:
            slow = [
                c
                for c in self._connections.values()
                if c.state == "reading" and c.reading_since < limit
            ]
            for conn in slow:
                conn.state = "closing"
        for conn in slow:
            self.count("requests not read within --read-timeout")
            conn.close()

    def stop(self, deadline: float) -> int:
        """Stop accepting, close idle connections, wait for the requests under way until
        ``deadline`` (``time.monotonic()``), then close the rest; returns how many requests
        were cut off that way."""
        with self._lock:
            self._stopping = True
        self.shutdown()  # the accept loop ends
        self.socket.close()  # new connections are refused by the system
        while True:
            with self._lock:
                busy = [c for c in self._connections.values() if c.state in ("reading", "working")]
                idle = [c for c in self._connections.values() if c.state == "idle"]
                for conn in idle:
                    conn.state = "closing"
            for conn in idle:
                conn.close()
            if not busy or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for conn in busy:
            conn.close()
        self._stopped.set()
        return len(busy)


def _refuse_connection(sock: socket.socket, stopping: bool) -> None:
    """Answer a connection past ``max_connections`` (or during a stop) with ``503`` and close
    it, without a thread and without waiting on the client."""
    message = "the receiver is stopping" if stopping else "too many connections; retry later"
    body = json.dumps({"code": 503, "message": message}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    try:
        sock.setblocking(False)
        sock.send(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()


class _HeaderBudget:
    """A stream whose ``readline`` gives at most ``budget`` bytes in all, then refuses (the
    standard library answers that with ``431``)."""

    def __init__(self, stream: io.BufferedIOBase, budget: int) -> None:
        self.stream = stream
        self.budget = budget

    def readline(self, size: int = -1) -> bytes:
        if self.budget <= 0:
            raise http.client.LineTooLong(f"headers larger than {_HEADER_BYTES} bytes")
        line = self.stream.readline(self.budget if size < 0 else min(size, self.budget))
        self.budget -= len(line)
        return line


# -- bodies -----------------------------------------------------------------------------------


def _read_exact(stream: io.BufferedIOBase, size: int, into: list[bytes]) -> None:
    """Read ``size`` bytes in pieces (a slow sender is cut off by the read timeout)."""
    while size > 0:
        piece = stream.read(min(size, _PIECE))
        if not piece:
            raise Gone("the client closed the connection before the end of the body")
        into.append(piece)
        size -= len(piece)


def _discard(stream: io.BufferedIOBase, size: int) -> None:
    while size > 0:
        piece = stream.read(min(size, _PIECE))
        if not piece:
            raise Gone("the client closed the connection before the end of the body")
        size -= len(piece)


def read_length(stream: io.BufferedIOBase, length_header: str, max_body: int) -> bytes:
    """A ``Content-Length`` body, refused before reading when above ``max_body``."""
    raw = length_header.strip()
    if not raw.isdigit() or len(raw) > 18:
        raise Refused(400, f"Content-Length {length_header[:40]!r} is not a byte count", close=True)
    length = int(raw)
    if length > max_body:
        raise Refused(413, f"the body ({length} bytes) is larger than {max_body} bytes", close=True)
    # One read into one buffer of the announced size (no copy); a stalled sender is cut off
    # by the idle timeout of each socket read, or by the read timeout's watchdog.
    body = stream.read(length)
    if len(body) < length:
        raise Gone("the client closed the connection before the end of the body")
    return body


def read_chunked(stream: io.BufferedIOBase, max_body: int) -> bytes:
    """A ``Transfer-Encoding: chunked`` body, at most ``max_body`` bytes: each chunk size is
    1 to 16 hex digits, checked against the bound before the chunk is read."""
    parts: list[bytes] = []
    size = 0
    while True:
        line = stream.readline(_CHUNK_LINE + 1)
        if not line:
            raise Gone("the client closed the connection inside a chunked body")
        if not line.endswith(b"\n"):
            raise Refused(400, f"a chunk-size line is longer than {_CHUNK_LINE} bytes", close=True)
        field = line.split(b";", 1)[0].strip()
        if not _HEX.fullmatch(field):
            shown = field[:20].decode("latin-1")
            raise Refused(
                400, f"the chunk size {shown!r} is not 1 to 16 hexadecimal digits", close=True
            )
        length = int(field, 16)
        if length == 0:
            for _ in range(_TRAILERS):
                trailer = stream.readline(_CHUNK_LINE + 1)
                if trailer in (b"\r\n", b"\n"):
                    return b"".join(parts)
                if not trailer:
                    raise Gone("the client closed the connection inside a chunked body")
            raise Refused(400, f"more than {_TRAILERS} trailer lines", close=True)
        size += length
        if size > max_body:
            raise Refused(413, f"the chunked body is larger than {max_body} bytes", close=True)
        _read_exact(stream, length, parts)
        if stream.readline(3) not in (b"\r\n", b"\n"):
            raise Refused(400, "a chunk is not followed by CRLF (wrong chunk size?)", close=True)


def gunzip(body: bytes, max_body: int) -> bytes:
    """``body`` decompressed, at most ``max_body`` bytes; :class:`Refused` otherwise."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = decompressor.decompress(body, max_body)
    except zlib.error as exc:
        raise Refused(400, f"the gzip body cannot be read: {exc}") from None
    if decompressor.unconsumed_tail:
        raise Refused(413, f"the body is larger than {max_body} bytes once decompressed")
    if not decompressor.eof:
        raise Refused(400, "the gzip body is truncated")
    return data


def json_too_deep(body: bytes, max_depth: int) -> bool:
    """Whether the arrays and objects of a JSON text nest deeper than ``max_depth`` (strings
    are skipped; a malformed text is left to the JSON parser)."""
    brackets = _JSON_STRING.sub(b"", body).translate(_ONE_KIND, _NOT_BRACKETS)
    # Each pass removes the innermost pairs: a depth of N is gone after N passes.
    for _ in range(max_depth):
        if not brackets:
            return False
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return False  # unbalanced: the parser says what is wrong
        brackets = shorter
    return bool(brackets) and b"[]" in brackets


# -- the handler ------------------------------------------------------------------------------


def _handler_class(limits: Limits) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "recalltrace-collect"
        timeout = limits.idle_timeout
        server: CollectServer

        def setup(self) -> None:
            super().setup()
            self.conn = self.server.connection(self.request)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args)

        def handle_one_request(self) -> None:
            self.server.set_state(self.conn, "idle")
            if self.conn.state == "closing":
                self.close_connection = True
                return
            super().handle_one_request()

        def parse_request(self) -> bool:
            # The request line has arrived: the request is under way from here. Its headers
            # are read through a budget (the standard library allows 100 lines of 64 KiB).
            self.server.set_state(self.conn, "reading")
            stream = self.rfile
            self.rfile = _HeaderBudget(stream, _HEADER_BYTES)  # type: ignore[assignment]
            try:
                return super().parse_request()
            finally:
                self.rfile = stream

        def _reply(
            self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection or self.server.stopping():
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, refused: Refused) -> None:
            self.server.count(f"answered {refused.status}")
            if refused.close:
                self.close_connection = True
            headers = {}
            if refused.retry_after is not None:
                headers["Retry-After"] = str(refused.retry_after)
            if refused.status >= 500 or refused.status == 429:
                logger.debug("recalltrace collect: %d %s", refused.status, refused.message)
            else:
                logger.warning(
                    "recalltrace collect: %d for %s: %s",
                    refused.status,
                    self.client_address[0],
                    refused.message,
                )
            body = json.dumps({"code": refused.status, "message": refused.message}).encode()
            self._reply(refused.status, body, JSON, headers)

        def do_POST(self) -> None:
            try:
                self._post()
            except Refused as refused:
                self._refuse(refused)
            except (Gone, ConnectionError, TimeoutError, OSError) as exc:
                # The client went away or stopped sending: nothing was answered or taken.
                self.close_connection = True
                self.server.count("requests cut off mid-body")
                logger.warning(
                    "recalltrace collect: a request from %s was cut off before its body was "
                    "read (%s): not taken",
                    self.client_address[0],
                    exc if isinstance(exc, Gone) else type(exc).__name__,
                )
            except Exception as exc:  # a bug, said in one line; the exporter may retry
                self.close_connection = True
                self.server.count("answered 500")
                logger.error(
                    "recalltrace collect: %s while taking an export: %s", type(exc).__name__, exc
                )
                body = json.dumps({"code": 500, "message": "internal error"}).encode()
                self._reply(500, body, JSON)
            finally:
                if not self.close_connection:
                    self.server.set_state(self.conn, "idle")

        def _post(self) -> None:
            receiver = self.server.receiver
            length_header = self.headers.get("Content-Length")
            chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
            if self.path.split("?")[0] != "/v1/traces":
                self._skip(length_header, chunked)
                raise Refused(404, "only POST /v1/traces is served")
            if receiver.token is not None:
                import hmac

                given = self.headers.get("Authorization", "")
                expected = f"Bearer {receiver.token}"
                if not hmac.compare_digest(given.encode(), expected.encode()):
                    self._skip(length_header, chunked)
                    raise Refused(401, "missing or wrong bearer token")
            if self._content_type() not in (PROTOBUF, JSON):
                self._skip(length_header, chunked)
                raise Refused(415, f"Content-Type must be {PROTOBUF} or {JSON}")
            if self._encoding() not in ("", "identity", "gzip"):
                self._skip(length_header, chunked)
                raise Refused(
                    415, f"Content-Encoding {self._encoding()!r} is not supported (use gzip)"
                )
            busy = receiver.busy()
            if busy is not None:
                self._skip(length_header, chunked)
                raise busy
            if not chunked and length_header is None:
                raise Refused(411, "a Content-Length or a chunked body is required", close=True)
            if not self.server.slots.acquire(timeout=limits.busy_wait):
                self._skip(length_header, chunked)
                raise Refused(
                    503,
                    f"{limits.max_concurrent} requests are being read already; retry later",
                    retry_after=1,
                )
            try:
                self._take(length_header, chunked)
            finally:
                self.server.slots.release()

        def _take(self, length_header: str | None, chunked: bool) -> None:
            receiver = self.server.receiver
            content_type = self._content_type()
            if chunked:
                body = read_chunked(self.rfile, limits.max_body)
            else:
                assert length_header is not None
                body = read_length(self.rfile, length_header, limits.max_body)
            self.server.set_state(self.conn, "working")
            # Decoding holds the interpreter's lock anyway: one body at a time is decoded (and
            # so multiplied into objects), the others wait with their bodies read.
            with self.server.decoding:
                if self._encoding() == "gzip":
                    body = gunzip(body, limits.max_body)
                if content_type == JSON and json_too_deep(body, limits.max_depth):
                    raise Refused(400, f"the JSON body nests deeper than {limits.max_depth} levels")
                try:
                    status, reply, reply_type = receiver.take(Export(body, content_type))
                except RecursionError:
                    raise Refused(400, "the body nests too deeply to be decoded") from None
            self.server.count(f"answered {status}")
            self._reply(status, reply, reply_type)

        def _content_type(self) -> str:
            return (self.headers.get("Content-Type") or PROTOBUF).split(";")[0].strip()

        def _encoding(self) -> str:
            return (self.headers.get("Content-Encoding") or "").strip().lower()

        def _skip(self, length_header: str | None, chunked: bool) -> None:
            """Read past a body that is refused, when that is cheap; else close afterwards."""
            if not chunked and length_header is not None and length_header.strip().isdigit():
                length = int(length_header.strip())
                if length <= limits.max_body:
                    _discard(self.rfile, length)
                    return
            self.close_connection = True

    return Handler


def start(
    host: str, port: int, receiver: Receiver, limits: Limits
) -> tuple[CollectServer, Callable[[float], int]]:
    """Listen and serve on daemon threads; returns the server and its ``stop(deadline)``."""
    server = CollectServer((host, port), receiver, limits)
    server.watch()
    threading.Thread(target=server.serve_forever, name="recalltrace-collect", daemon=True).start()
    return server, server.stop
