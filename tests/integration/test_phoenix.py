"""Scores back where users look at traces: a real Arize Phoenix server receives a decorated
app's spans, and the worker posts each score to it as an annotation of the request's span."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from sqlalchemy import select
from sqlalchemy.orm import Session

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Score, Trace
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer
from tests.support.phoenix import PhoenixServer

# The real-system stage (Arize Phoenix in an environment of its own); the first run installs
# Phoenix, which takes minutes.
pytestmark = [pytest.mark.timeout(900), pytest.mark.realsystem]

PROJECT = "support-bot"
CODE_METRIC = "id_based_context_recall"
LLM_METRIC = "judge_context_recall"
KB = {
    "kb-1": "Refunds are issued within 14 days of the return.",
    "kb-2": "Shipping to Norway takes five working days.",
    "kb-3": "Gift cards never expire.",
}
QUESTIONS = [
    ("How long do refunds take?", ["kb-1"], "Refunds take 14 days."),
    ("How long is shipping to Norway?", ["kb-2", "kb-3"], "Five working days."),
    ("Do gift cards expire?", ["kb-3"], "No, they never expire."),
]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhoenixServer]:
    with PhoenixServer(tmp_path_factory.mktemp("phoenix")) as server:
        yield server


def run_app(phoenix: PhoenixServer, url: str) -> list[Any]:
    """A decorated RAG app whose spans go to Phoenix over OTLP/HTTP; returns its records."""
    resource = Resource.create(
        {"service.name": "support-api", "openinference.project.name": PROJECT}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=phoenix.traces_endpoint))
    )
    recalltrace.configure(tracer_provider=provider, database_url=url, flush_interval=0.05)

    @recalltrace.retrieval(data_source="kb")
    def search(query: str) -> list[dict[str, Any]]:
        words = set(query.lower().split())
        hits = [k for k, text in KB.items() if words & set(text.lower().split())]
        return [{"id": k, "content": KB[k], "score": 0.9} for k in hits[:1]]

    @recalltrace.rag(
        "support-bot", reference_context_ids_param="expected", reference_param="reference"
    )
    def answer(question: str, expected: list[str], reference: str) -> str:
        docs = search(question)
        return docs[0]["content"] if docs else "I do not know."

    for question, expected, reference in QUESTIONS:
        answer(question, expected, reference)
    assert recalltrace.flush(10)
    recalltrace.shutdown(5)
    assert provider.force_flush(10_000)
    provider.shutdown()
    engine = create_engine_from_url(url)
    with Session(engine) as session:
        records = list(session.scalars(select(Trace)))
    engine.dispose()
    return records


def stored_scores(url: str) -> list[Score]:
    engine = create_engine_from_url(url)
    with Session(engine) as session:
        scores = list(session.scalars(select(Score)))
    engine.dispose()
    return scores


def run_worker(url: str, judge: JudgeServer, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "OTEL_"))}
    env["OPENAI_API_KEY"] = "test-key"
    command = [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url]
    command += ["--metric", CODE_METRIC, "--metric", LLM_METRIC, "--no-progress"]
    command += ["--judge-model", "openai/test-judge", "--judge-api-base", judge.base_url]
    return subprocess.run(
        [*command, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def test_spans_and_annotations_show_in_phoenix(phoenix: PhoenixServer, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    upgrade(url)
    records = run_app(phoenix, url)
    assert len(records) == 3

    # The spans arrived, with the documents on the retriever spans.
    spans = phoenix.spans(PROJECT, expect=6)
    roots = {s["context"]["span_id"]: s for s in spans if s["name"] == "support-bot"}
    assert set(roots) == {r.otel_span_id for r in records}
    retrievers = [s for s in spans if s["span_kind"] == "RETRIEVER"]
    assert len(retrievers) == 3
    shown = json.dumps([s["attributes"] for s in retrievers])
    for text in KB.values():
        assert text in shown

    with JudgeServer() as judge:
        done = run_worker(url, judge, "--phoenix", phoenix.url)
    assert done.returncode == 0, done.stderr
    assert "scored 6" in done.stdout
    assert "Phoenix annotations: 6 posted" in done.stderr

    annotations = phoenix.get(
        f"/v1/projects/{PROJECT}/span_annotations", span_ids=list(roots), limit=100
    )["data"]
    span_of = {r.trace_id: r.otel_span_id for r in records}
    expected = {(span_of[s.trace_id], s.metric): s for s in stored_scores(url)}
    assert len(expected) == 6
    got = {(a["span_id"], a["name"]): a for a in annotations}
    assert set(got) == set(expected)
    for key, score in expected.items():
        annotation = got[key]
        assert annotation["result"]["score"] == pytest.approx(score.value)
        assert annotation["result"]["explanation"] == score.reason
        assert annotation["result"]["label"] in {"complete", "partial", "none"}
        assert annotation["annotator_kind"] == ("LLM" if key[1] == LLM_METRIC else "CODE")
        assert annotation["identifier"] == "recalltrace"
        assert annotation["metadata"]["record_id"] in {r.trace_id for r in records}
    by_record = {r.otel_span_id: r for r in records}
    refunds = next(k for k, r in by_record.items() if r.user_input == QUESTIONS[0][0])
    assert got[(refunds, CODE_METRIC)]["result"]["label"] == "complete"


def test_annotations_phoenix_cannot_take_are_counted_with_their_reason(
    phoenix: PhoenixServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=[CODE_METRIC])
    unknown = [make_trace(reference_context_ids=["doc_0"]) for _ in range(2)]
    for index, record in enumerate(unknown):
        record.otel_trace_id = f"{index + 1:032x}"
        record.otel_span_id = f"{index + 0xABC:016x}"
    no_span = make_trace(reference_context_ids=["doc_0"])
    no_span.otel_trace_id = no_span.otel_span_id = None
    repo.write_traces([*unknown, no_span])
    repo.dispose()
    with JudgeServer() as judge:
        done = run_worker(url, judge, "--phoenix", phoenix.url, "--grace-period", "3")
    assert done.returncode == 0, done.stderr
    assert "scored 3" in done.stdout
    assert (
        "Phoenix annotations: 0 posted, 3 not posted (2 Phoenix does not have the request's "
        "span; 1 the record has no OpenTelemetry span id)"
    ) in done.stderr

    # Phoenix down: the scores are stored, the worker ends within its grace period, and the
    # annotations it could not post are counted.
    url = f"sqlite:///{tmp_path / 'down.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=[CODE_METRIC])
    records = [make_trace(reference_context_ids=["doc_0"]) for _ in range(4)]
    for index, record in enumerate(records):
        record.otel_trace_id = f"{index + 1:032x}"
        record.otel_span_id = f"{index + 1:016x}"
    repo.write_traces(records)
    repo.dispose()
    with JudgeServer() as judge:
        down = run_worker(url, judge, "--phoenix", "http://127.0.0.1:9", "--grace-period", "2")
    assert down.returncode == 0, down.stderr
    assert "scored 4" in down.stdout
    assert "4 not posted (4 Phoenix could not be reached before the worker stopped" in down.stderr
