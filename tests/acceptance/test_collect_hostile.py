"""``recalltrace collect`` under hostile and heavy senders: the real process, driven over raw
sockets and ``http.client`` on 127.0.0.1, with its memory read from ``/proc``.

Each sender is one the receiver must survive with memory bounded by its options (here a 4 MiB
body cap, 4 requests read at once, 32 MB of held spans), answering with the statuses an OTLP
exporter understands and never printing a traceback."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.test_collect import Collect, start_collect
from tests.support import ROOT
from tests.support.clocks import HANG_GUARD_S

pytestmark = pytest.mark.postgres

MiB = 1024 * 1024
BOUNDS = (
    "--max-body-mb",
    "4",
    "--max-concurrent",
    "4",
    "--max-buffer-mb",
    "32",
    "--max-spans-per-trace",
    "5000",
)
# The receiver idles at about 40 MB (Python, protobuf, SQLAlchemy, OpenTelemetry); with the
# bounds above everything it may hold on top stays well under this.
RSS_BOUND_KB = 250 * 1024


# -- OTLP protobuf, written by hand (fast enough for hundreds of thousands of spans) ----------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _attribute(key: str, value: str) -> bytes:
    return _field(1, key.encode()) + _field(2, _field(1, value.encode()))


def span(
    trace_id: bytes,
    span_id: int,
    name: str,
    parent: int | None = None,
    attributes: dict[str, str] | None = None,
) -> bytes:
    body = _field(1, trace_id) + _field(2, span_id.to_bytes(8, "big"))
    if parent is not None:
        body += _field(4, parent.to_bytes(8, "big"))
    body += _field(5, name.encode())
    body += b"\x39" + struct.pack("<Q", 1_000_000) + b"\x41" + struct.pack("<Q", 2_000_000)
    for key, value in (attributes or {}).items():
        body += _field(9, _attribute(key, value))
    return body


def export_body(spans: list[bytes]) -> bytes:
    scope = b"".join(_field(2, s) for s in spans)
    return _field(1, _field(2, scope))


def rag_trace(trace_number: int, question: str) -> bytes:
    """One RAG request as OpenInference spans: a chain, a retrieval and a generation."""
    trace_id = trace_number.to_bytes(16, "big")
    root = trace_number * 4 + 1
    return export_body(
        [
            span(
                trace_id,
                root + 1,
                "search",
                root,
                {
                    "openinference.span.kind": "RETRIEVER",
                    "input.value": question,
                    "retrieval.documents.0.document.id": "doc-1",
                    "retrieval.documents.0.document.content": "Refunds take five days.",
                },
            ),
            span(
                trace_id,
                root + 2,
                "generate",
                root,
                {
                    "openinference.span.kind": "LLM",
                    "llm.output_messages.0.message.role": "assistant",
                    "llm.output_messages.0.message.content": "Five days.",
                },
            ),
            span(
                trace_id,
                root,
                "answer",
                None,
                {
                    "openinference.span.kind": "CHAIN",
                    "input.value": question,
                    "output.value": "Five days.",
                },
            ),
        ]
    )


# -- the process ------------------------------------------------------------------------------


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads in /proc/PID/status")


def address(service: Collect) -> tuple[str, int]:
    parts = urlsplit(service.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def stop(service: Collect) -> str:
    """SIGTERM; its stderr once the process ended. Waiting longer than ``HANG_GUARD_S`` (far
    past any --stop-timeout here) is a failure: the process does not end by itself."""
    service.process.send_signal(signal.SIGTERM)
    try:
        _, err = service.process.communicate(timeout=HANG_GUARD_S)
    except BaseException:
        service.process.kill()
        service.process.communicate(timeout=30)
        raise
    return err


@pytest.fixture
def hostile(postgres_url: str, pg_engine: Engine) -> Iterator[Collect]:
    service = start_collect(postgres_url, *BOUNDS, "--trace-idle", "30")
    yield service
    if service.process.poll() is None:
        service.process.kill()
        service.process.communicate(timeout=30)


def read_status(sock: socket.socket, timeout: float = 30.0) -> tuple[int, bytes]:
    """The status and the head of the answer on ``sock``."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    assert data.startswith(b"HTTP/1."), data[:200]
    return int(data.split(b" ", 2)[1]), data


def post_raw(hostile: Collect, head: bytes, stream: Iterator[bytes]) -> int:
    """Send ``head`` then pieces of ``stream`` until the receiver answers; the status."""
    heads = (head[at : at + 65536] for at in range(0, len(head), 65536))
    with socket.create_connection(address(hostile), timeout=30) as sock:
        for piece in itertools.chain(heads, stream):
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(piece)
            except OSError:
                break
        else:
            sock.shutdown(socket.SHUT_WR)
        return read_status(sock)[0]


def chunked_head(first_size_line: bytes) -> bytes:
    return (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + first_size_line
    )


def test_chunked_bodies_with_bad_sizes_are_refused_within_the_body_cap(
    hostile: Collect,
) -> None:
    mebibyte = b"\0" * MiB

    def endless(count: int) -> Iterator[bytes]:
        return (mebibyte for _ in range(count))

    # A negative size (-1 was read as "read to the end"), then 300 MB that must not be held.
    assert post_raw(hostile, chunked_head(b"-1\r\n"), endless(300)) == 400
    assert post_raw(hostile, chunked_head(b"-989680\r\n"), endless(50)) == 400
    # A size larger than the cap, a size of more than 16 digits, a size line that never ends.
    assert post_raw(hostile, chunked_head(b"ffffffffffffffff\r\n"), endless(50)) == 413
    assert post_raw(hostile, chunked_head(b"1" * 40 + b"\r\n"), endless(50)) == 400
    assert post_raw(hostile, chunked_head(b"1" * 5000), endless(50)) == 400
    assert post_raw(hostile, chunked_head(b"zz\r\n"), endless(50)) == 400
    # Endless well-formed chunks: refused once they pass the cap.
    chunks = (b"100000\r\n" + mebibyte + b"\r\n" for _ in range(300))
    assert post_raw(hostile, chunked_head(b""), chunks) == 413
    # Headers: at most 64 KiB in all (431), whatever the number of lines.
    huge_headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 60_000) for i in range(90))
    head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n" + huge_headers + b"\r\n"
    assert post_raw(hostile, head, endless(0)) == 431
    # A gzip body of 64 kB that would expand to 256 MB: refused once past the cap.
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = b"".join(packer.compress(mebibyte) for _ in range(256)) + packer.flush()
    head = (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n" % len(bomb)
    )
    assert post_raw(hostile, head + bomb, endless(0)) == 413
    # A Content-Length above the cap is refused before the body is read.
    head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n"
    assert post_raw(hostile, head, endless(300)) == 413
    peak = peak_rss_kb(hostile.process.pid)
    print(f"peak RSS {peak} kB")
    err = stop(hostile)
    assert peak < RSS_BOUND_KB, f"peak RSS {peak} kB"
    assert "Traceback" not in err, err
    assert "answered 400 5" in err and "answered 413 4" in err, err


def test_many_large_uploads_at_once_are_read_four_at_a_time(
    postgres_url: str, pg_engine: Engine
) -> None:
    # 60 senders each start a 4 MiB export (under the cap) and hold its last byte until every
    # sender has sent the rest: exactly four are read at once, the others answered 503 +
    # Retry-After. A sender's small send buffer means that its sendall() returns only once the
    # receiver took the body (read it in a slot, or discarded it when none freed up): all
    # decisions are made before any last byte goes, however slowly the senders get there.
    # The read timeout only cuts bodies that never complete.
    hostile = start_collect(postgres_url, *BOUNDS, "--read-timeout", "600")
    attribute = "x" * 10_000
    host, port = address(hostile)
    results: list[tuple[int, bytes]] = []
    lock = threading.Lock()
    all_sent = threading.Barrier(60)

    def send(number: int) -> None:
        trace_id = (10_000 + number).to_bytes(16, "big")
        spans = [span(trace_id, i + 1, "s", None, {"blob": attribute}) for i in range(400)]
        body = export_body(spans)
        assert len(body) < 4 * MiB
        head = (
            f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            sock.settimeout(HANG_GUARD_S)
            sock.connect((host, port))
            with contextlib.suppress(OSError):  # answered 503 and closed before the end
                sock.sendall(head + body[:-1])
            with contextlib.suppress(threading.BrokenBarrierError):  # a sender hangs
                all_sent.wait(HANG_GUARD_S)
            with contextlib.suppress(OSError):
                sock.sendall(body[-1:])
            outcome = read_status(sock, HANG_GUARD_S)
        with lock:
            results.append(outcome)

    senders = [threading.Thread(target=send, args=(n,)) for n in range(60)]
    for sender in senders:
        sender.start()
    try:
        for sender in senders:
            sender.join(3 * HANG_GUARD_S)
        peak = peak_rss_kb(hostile.process.pid)
        print(f"peak RSS {peak} kB")
    finally:
        err = stop(hostile)
    statuses = sorted(status for status, _ in results)
    assert len(statuses) == 60, statuses
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) == 4, statuses  # four at once, and no slot freed before
    assert all(b"Retry-After: 1" in head for status, head in results if status == 503)
    assert peak < RSS_BOUND_KB, f"peak RSS {peak} kB"
    assert "Traceback" not in err, err


def test_a_trace_of_half_a_million_spans_without_root_is_held_up_to_its_bound(
    hostile: Collect,
) -> None:
    # One trace, no root span (every span names a parent never sent), in 125 exports of 4000.
    trace_id = (77).to_bytes(16, "big")
    # Every span is the same bytes but for its id: written from a template, this is quick.
    head, tail = span(trace_id, 1, "step", 999_999_999, {"k": "v"}).split((1).to_bytes(8, "big"))
    connection = http.client.HTTPConnection(*address(hostile), timeout=60)
    sent = 0
    for request in range(125):
        spans = [head + (1 + request * 4000 + i).to_bytes(8, "big") + tail for i in range(4000)]
        connection.request(
            "POST",
            "/v1/traces",
            export_body(spans),
            {"Content-Type": "application/x-protobuf"},
        )
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        sent += len(spans)
    connection.close()
    peak = peak_rss_kb(hostile.process.pid)
    print(f"peak RSS {peak} kB")
    err = stop(hostile)
    assert peak < RSS_BOUND_KB, f"peak RSS {peak} kB"
    assert f"{sent} span(s) received" in err, err
    assert f"{sent - 5000} span(s) past --max-spans-per-trace left out" in err, err
    assert "Traceback" not in err, err


def test_many_open_traces_are_held_up_to_the_buffer_bound(hostile: Collect) -> None:
    # 50 traces without root, 3000 spans of about 1 kB each: 165 MB of spans against a
    # --max-buffer-mb of 32. The oldest traces are dropped, and counted, to stay under it.
    connection = http.client.HTTPConnection(*address(hostile), timeout=60)
    for number in range(50):
        trace_id = (1000 + number).to_bytes(16, "big")
        template = span(trace_id, 1, "step", 999_999_999, {"blob": "b" * 1000})
        head, tail = template.split((1).to_bytes(8, "big"))
        spans = [head + (i + 1).to_bytes(8, "big") + tail for i in range(3000)]
        connection.request(
            "POST", "/v1/traces", export_body(spans), {"Content-Type": "application/x-protobuf"}
        )
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    connection.close()
    peak = peak_rss_kb(hostile.process.pid)
    print(f"peak RSS {peak} kB")
    err = stop(hostile)
    assert peak < RSS_BOUND_KB, f"peak RSS {peak} kB"
    summary = err.splitlines()[-1]
    evicted = int(summary.split(" trace(s) evicted")[0].rsplit(" ", 1)[1])
    assert 40 <= evicted <= 48, summary  # about six traces of 5 MB fit in 32 MB
    assert f"capture_evicted {evicted}" in summary, summary
    assert "Traceback" not in err, err


def nested_json(depth: int) -> bytes:
    value = '{"stringValue": "deep"}'
    for _ in range(depth):
        value = '{"kvlistValue": {"values": [{"key": "k", "value": ' + value + "}]}}"
    return (
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": '
        '"0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "s", '
        '"attributes": [{"key": "a", "value": ' + value + "}]}]}]}]}"
    ).encode()


def nested_protobuf(depth: int) -> bytes:
    value = _field(1, b"deep")  # AnyValue.string_value
    for _ in range(depth):
        value = _field(6, _field(1, _field(1, b"k") + _field(2, value)))  # kvlist_value
    attribute = _field(1, b"a") + _field(2, value)
    one = _field(1, b"\1" * 16) + _field(2, b"\2" * 8) + _field(5, b"s") + _field(9, attribute)
    return export_body([one])


def test_deeply_nested_bodies_are_400_and_the_connection_stays_usable(hostile: Collect) -> None:
    connection = http.client.HTTPConnection(*address(hostile), timeout=30)

    def post(body: bytes, content_type: str) -> tuple[int, bytes]:
        connection.request("POST", "/v1/traces", body, {"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, response.read()

    status, reply = post(b"[" * 200_000 + b"]" * 200_000, "application/json")
    assert status == 400 and b"nests deeper than 64" in reply
    status, reply = post(nested_json(5_000), "application/json")
    assert status == 400 and b"nests deeper than 64" in reply
    status, _ = post(nested_protobuf(5_000), "application/x-protobuf")
    assert status == 400
    # Nesting within the bound is read (an attribute holding a small map of maps).
    status, _ = post(nested_json(10), "application/json")
    assert status == 200
    connection.close()
    err = stop(hostile)
    assert "Traceback" not in err, err


def test_idle_slow_and_vanishing_connections_are_closed_without_tracebacks(
    postgres_url: str, pg_engine: Engine
) -> None:
    service = start_collect(
        postgres_url,
        *BOUNDS,
        "--idle-timeout",
        "2",
        "--read-timeout",
        "4",
        "--max-connections",
        "32",
    )
    pid = service.process.pid
    try:
        target = address(service)
        idle = [socket.create_connection(target, timeout=30) for _ in range(300)]
        most_threads = threads(pid)
        # Clients that vanish mid-request: a half request line, headers only, half a body;
        # closed politely (FIN) or reset (RST).
        partial = [
            b"POST /v1/tra",
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n",
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"\0" * 10,
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nab",
        ]
        for payload in partial * 10:
            for reset in (False, True):
                sock = socket.create_connection(target, timeout=30)
                sock.sendall(payload)
                time.sleep(0.01)
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                most_threads = max(most_threads, threads(pid))
        # A sender that trickles its body, one byte every half second (under the idle timeout).
        slow = socket.create_connection(target, timeout=30)
        slow.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        trickle_closed = None
        started = time.monotonic()
        while time.monotonic() - started < HANG_GUARD_S:  # cut after --read-timeout 4
            try:
                slow.sendall(b"\0")
                readable, _, _ = select.select([slow], [], [], 0.5)
                if readable and not slow.recv(65536):
                    trickle_closed = time.monotonic() - started
                    break
            except OSError:
                trickle_closed = time.monotonic() - started
                break
        slow.close()
        assert trickle_closed is not None, "a trickling body was never cut off"
        # Every idle connection is closed by the receiver (after the idle timeout, or earlier
        # to make room for a newer one).
        deadline = time.monotonic() + HANG_GUARD_S  # closed after --idle-timeout 2
        open_ones = list(idle)
        while open_ones and time.monotonic() < deadline:
            readable, _, _ = select.select(open_ones, [], [], 0.5)
            for sock in readable:
                try:
                    while sock.recv(65536):
                        pass
                except OSError:
                    pass
                open_ones.remove(sock)
                sock.close()
            most_threads = max(most_threads, threads(pid))
        assert not open_ones, f"{len(open_ones)} idle connection(s) never closed"
        # Still serving.
        status, _, _ = service.post(b"{}")
        assert status == 200
    finally:
        err = stop(service)
    print(f"most threads {most_threads}")
    assert most_threads <= 32 + 8, most_threads  # the connections' and a few of its own
    assert "Traceback" not in err, err


def test_sigterm_under_load_exits_in_time_and_stores_every_request_answered_200(
    postgres_url: str, pg_engine: Engine
) -> None:
    service = start_collect(postgres_url, *BOUNDS, "--stop-timeout", "6")
    target = address(service)
    answered: list[str] = []
    lock = threading.Lock()

    def send(sender: int) -> None:
        connection = http.client.HTTPConnection(*target, timeout=30)
        for number in range(100_000):
            question = f"sender {sender} question {number}"
            body = rag_trace(sender * 1_000_000 + number + 1, question)
            try:
                connection.request(
                    "POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"}
                )
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                if service.process.poll() is not None:
                    return
                connection = http.client.HTTPConnection(*target, timeout=30)
                time.sleep(0.05)
                continue
            if response.status == 200:
                with lock:
                    answered.append(question)

    senders = [threading.Thread(target=send, args=(n,)) for n in range(6)]
    for sender in senders:
        sender.start()
    time.sleep(4)
    # The senders never stop by themselves: the process ends only because --stop-timeout
    # closes what is still open (a hang is a failure in stop()).
    err = stop(service)
    for sender in senders:
        sender.join(HANG_GUARD_S)
    print(f"{len(answered)} answered 200; {err.splitlines()[-1]}")
    assert len(answered) > 20, len(answered)
    with pg_engine.connect() as conn:
        stored = {row[0] for row in conn.execute(text("SELECT user_input FROM traces"))}
    missing = set(answered) - stored
    assert not missing, f"{len(missing)} request(s) answered 200 are not stored: {err}"
    assert "0 trace(s) answered 200 not built" in err, err
    assert "records not stored: 0 " in err, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-concurrent", "0"], "--max-concurrent: expected a whole number >= 1, got '0'"),
        (["--max-body-mb", "-1"], "--max-body-mb: expected a positive number, got '-1'"),
        (["--idle-timeout", "soon"], "--idle-timeout: expected a positive number, got 'soon'"),
        (["--max-depth", "3"], "--max-depth must be at least 10"),
        (["--max-connections", "2"], "--max-connections (2) must be at least --max-concurrent"),
    ],
)
def test_bad_bounds_are_refused_in_one_line(options: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "recalltrace", "collect", "--listen", "127.0.0.1:0", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], done.stderr


def test_spans_whose_parents_form_a_loop_or_repeat_are_counted(hostile: Collect) -> None:
    trace_id = (55).to_bytes(16, "big")
    loop = [span(trace_id, 1, "a", 2), span(trace_id, 2, "b", 1), span(trace_id, 3, "c", 3)]
    connection = http.client.HTTPConnection(*address(hostile), timeout=30)
    for _ in range(2):  # the second export repeats the spans of the first
        connection.request(
            "POST", "/v1/traces", export_body(loop), {"Content-Type": "application/x-protobuf"}
        )
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    connection.close()
    err = stop(hostile)
    assert "3 duplicate span(s) ignored" in err, err
    assert "capture_parent_loop 3" in err, err
    assert "Traceback" not in err, err
