"""``recalltrace collect`` as a service would use it: real OTLP exporters (the OpenTelemetry
Python SDK's, over http/protobuf with gzip, and the OpenTelemetry JS SDK's, over http/json)
send the spans of RAG requests; the requests are stored and a real worker scores them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from sqlalchemy import Engine, text

import recalltrace
from recalltrace.storage.records import ReferenceUpdate
from tests.support import ROOT
from tests.support.capture import ANSWERS, CORPUS, QUESTIONS, ranked, run_worker, stored
from tests.support.judge_server import JudgeServer

NODE_PACKAGES = [
    "@opentelemetry/api@1",
    "@opentelemetry/sdk-trace-node@2",
    "@opentelemetry/sdk-trace-base@2",
    "@opentelemetry/exporter-trace-otlp-http@0",
    "@opentelemetry/resources@2",
]


class Collect:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url

    def post(
        self, body: bytes, content_type: str = "application/json", **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": content_type, **headers}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def stop(self) -> str:
        self.process.terminate()
        _, err = self.process.communicate(timeout=30)
        return err


def start_collect(database_url: str, *extra: str, env: dict[str, str] | None = None) -> Collect:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    environment.update(env or {})
    command = [sys.executable, "-m", "recalltrace", "collect", "--listen", "127.0.0.1:0"]
    command += ["--database-url", database_url, *extra]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY "):
        process.kill()
        raise AssertionError(f"collect did not start: {line}{process.communicate()[1]}")
    return Collect(process, line.split()[1])


@pytest.fixture
def collect(postgres_url: str, pg_engine: Engine) -> Iterator[Collect]:
    service = start_collect(postgres_url, "--trace-idle", "1")
    yield service
    if service.process.poll() is None:
        service.stop()


def wait_for_records(engine: Engine, count: int) -> list[Any]:
    deadline = time.monotonic() + 30
    while True:
        records = stored(engine)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def score_all(database_url: str, engine: Engine, records: list[Any]) -> None:
    repository = recalltrace.open_repository(database_url)
    try:
        for record in records:
            first = ranked(record.user_input)[0]
            repository.attach_reference(
                ReferenceUpdate(
                    record.trace_id,
                    reference=CORPUS[first],
                    reference_contexts=[CORPUS[first]],
                    reference_context_ids=[first],
                )
            )
    finally:
        repository.dispose()
    with JudgeServer() as judge:
        done = run_worker(database_url, judge)
    assert done.returncode == 0, done.stderr
    for record in stored(engine):
        assert len(record.scores) == 6
        assert set(record.scores.values()) == {"scored"}, record.scores


def send_openinference_requests(url: str) -> None:
    """Two requests as OpenInference spans, exported by the SDK's OTLP exporter (protobuf,
    gzip)."""
    resource = Resource.create(
        {
            "service.name": "python-rag",
            "service.version": "3.1.0",
            "deployment.environment.name": "staging",
        }
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=url, compression=Compression.Gzip)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    for question in QUESTIONS:
        with tracer.start_as_current_span("answer") as root:
            root.set_attribute("openinference.span.kind", "CHAIN")
            root.set_attribute("input.value", question)
            with tracer.start_as_current_span("search") as retriever:
                retriever.set_attribute("openinference.span.kind", "RETRIEVER")
                retriever.set_attribute("input.value", question)
                for index, doc_id in enumerate(ranked(question)):
                    prefix = f"retrieval.documents.{index}.document."
                    retriever.set_attribute(prefix + "id", doc_id)
                    retriever.set_attribute(prefix + "content", CORPUS[doc_id])
                    retriever.set_attribute(prefix + "score", 1.0 - index / 10)
            with tracer.start_as_current_span("generate") as llm:
                llm.set_attribute("openinference.span.kind", "LLM")
                llm.set_attribute("llm.model_name", "gpt-test")
                llm.set_attribute("llm.output_messages.0.message.role", "assistant")
                llm.set_attribute("llm.output_messages.0.message.content", ANSWERS[question])
                llm.set_attribute("llm.token_count.prompt", 30)
                llm.set_attribute("llm.token_count.completion", 5)
            root.set_attribute("output.value", ANSWERS[question])
    provider.shutdown()


@pytest.mark.postgres
def test_the_python_sdk_exporter_sends_protobuf_and_the_requests_are_stored_and_scored(
    collect: Collect, postgres_url: str, pg_engine: Engine
) -> None:
    send_openinference_requests(collect.url)
    records = wait_for_records(pg_engine, len(QUESTIONS))
    assert [r.user_input for r in records] == list(QUESTIONS)
    for record in records:
        question = record.user_input
        assert record.ids == ranked(question)
        assert record.contents == [CORPUS[i] for i in ranked(question)]
        assert record.response == ANSWERS[question]
        assert record.app_name == "answer"
        assert record.notes == []
    # The sending service's resource names the release and environment of its requests.
    with pg_engine.connect() as conn:
        labels = conn.execute(text("SELECT DISTINCT release, environment FROM traces")).all()
    assert [tuple(row) for row in labels] == [("3.1.0", "staging")]
    score_all(postgres_url, pg_engine, records)
    summary = collect.stop()
    assert "2 request(s) found" in summary and "0 rejected" in summary


@pytest.mark.postgres
def test_unreadable_spans_are_rejected_as_partial_success(
    collect: Collect, pg_engine: Engine
) -> None:
    good = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331"}
    bad = {"traceId": "0af7", "spanId": "b7ad6b7169203331"}
    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {**good, "name": "ok", "endTimeUnixNano": "2"},
                            {**bad, "name": "bad"},
                        ]
                    }
                ]
            }
        ]
    }
    status, _, reply = collect.post(json.dumps(body).encode())
    assert status == 200  # the readable span is taken, the other one rejected
    partial = json.loads(reply)["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "16 bytes" in partial["errorMessage"]
    status, _, reply = collect.post(json.dumps(body).replace('"0af7"', '"zz"').encode())
    assert status == 400 and b"is not hex" in reply
    status, _, reply = collect.post(b"not protobuf", "application/x-protobuf")
    assert status == 400 and b"not an OTLP protobuf" in reply
    status, _, _ = collect.post(b"{}", "text/plain")
    assert status == 415


@pytest.mark.postgres
def test_a_token_is_required_when_set(postgres_url: str, pg_engine: Engine) -> None:
    service = start_collect(postgres_url, env={"RECALLTRACE_COLLECT_TOKEN": "s3cret"})
    try:
        status, _, _ = service.post(b"{}")
        assert status == 401
        status, _, _ = service.post(b"{}", Authorization="Bearer wrong")
        assert status == 401
        status, _, _ = service.post(b"{}", Authorization="Bearer s3cret")
        assert status == 200
    finally:
        service.stop()


def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    # Storage that takes no write after collect started (it does not start on a database it
    # cannot reach): the first record is held for a retry, filling a queue of one.
    import sqlite3

    path = tmp_path / "held.db"
    service = start_collect(f"sqlite:///{path}", env={"RECALLTRACE_MAX_QUEUE_SIZE": "1"})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        send_openinference_requests(service.url)  # the SDK exporter retries 503s for a while
        for _ in range(100):  # the records are built within a second of their root span
            status, headers, reply = service.post(b"{}")
            if status == 503:
                break
            time.sleep(0.1)
        assert status == 503
        assert headers.get("Retry-After") == "2"
        assert b"queue is full" in reply
    finally:
        service.process.kill()
        service.process.communicate(timeout=30)
        holder.close()


def node_modules() -> Path:
    """The OpenTelemetry JS packages, installed once with npm into the user's cache."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed")
    folder = Path.home() / ".cache" / "recalltrace-tests" / "node-otlp"
    marker = folder / "node_modules" / "@opentelemetry" / "exporter-trace-otlp-http"
    if not marker.exists():
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", *NODE_PACKAGES],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    return folder / "node_modules"


@pytest.mark.postgres
@pytest.mark.realsystem  # a Node app with the OpenTelemetry JS SDK
def test_a_node_app_sends_genai_spans_as_json_and_they_are_stored_and_scored(
    collect: Collect, postgres_url: str, pg_engine: Engine
) -> None:
    modules = node_modules()
    scenario = [
        {
            "question": question,
            "answer": ANSWERS[question],
            "documents": [
                {"id": doc_id, "score": 1.0 - index / 10, "content": CORPUS[doc_id]}
                for index, doc_id in enumerate(ranked(question))
            ],
        }
        for question in QUESTIONS
    ]
    app = ROOT / "tests" / "acceptance" / "node_app" / "app.js"
    done = subprocess.run(
        ["node", str(app), collect.url, json.dumps(scenario)],
        env={**os.environ, "NODE_PATH": str(modules)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    records = wait_for_records(pg_engine, len(QUESTIONS))
    assert [r.user_input for r in records] == list(QUESTIONS)
    for record in records:
        question = record.user_input
        assert record.ids == ranked(question)
        assert record.contents == [CORPUS[i] for i in ranked(question)]
        assert record.response == ANSWERS[question]
        assert record.app_name == "support"
        assert record.notes == []
    score_all(postgres_url, pg_engine, records)
