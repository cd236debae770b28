"""Everything ``recalltrace collect`` takes in goes through the tracer's scrubbing: secrets put
in every place a sending service can put them (span names, every attribute the conventions
read, document metadata holding numbers, events, links, status, resource attributes, the
instrumentation scope) are in no row of any table and in nothing the collector logs."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode
from sqlalchemy import inspect, text

from recalltrace.storage.db import create_engine_from_url
from tests.acceptance.test_collect import start_collect, wait_for_records
from tests.support.postgres import truncate_all

GITHUB = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
AWS = "AKIAZ7QX4LM2RT6WPB5N"
CARD = "4539148803436467"
EMAIL = "jane.doe@example.org"
SECRETS = (GITHUB, AWS, CARD, EMAIL)
TEXT = f"token {GITHUB} key {AWS} card {CARD} mail {EMAIL}"


def _dump(url: str) -> str:
    engine = create_engine_from_url(url)
    parts = []
    with engine.connect() as conn:
        for table in inspect(engine).get_table_names():
            for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                parts.append(json.dumps([str(value) for value in row], ensure_ascii=False))
    engine.dispose()
    return "\n".join(parts)


def _send(url: str) -> None:
    provider = TracerProvider(
        resource=Resource.create(
            {
                "service.name": f"svc {EMAIL}",
                "service.version": f"3.1 {GITHUB}",
                "deployment.environment.name": f"prod {AWS}",
            }
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url)))
    tracer = provider.get_tracer(f"app {EMAIL}", f"1.0 {AWS}")
    metadata = json.dumps({"card": int(CARD), "owner": EMAIL, "api_key": "plainword"})
    other = tracer.start_span("elsewhere")
    other.end()
    with tracer.start_as_current_span(f"answer {EMAIL}") as root:
        root.set_attributes(
            {
                "openinference.span.kind": "CHAIN",
                "input.value": f"Why does {TEXT} fail?",
                "user.id": EMAIL,
                "session.id": f"s-{GITHUB}",
                "tag.tags": [f"t {AWS}", "plain"],
                "metadata": metadata,
                "card_as_number": int(CARD),
            }
        )
        root.add_event(f"event {EMAIL}", {"detail": TEXT})
        root.add_link(other.get_span_context(), {"why": TEXT})
        with tracer.start_as_current_span(f"search {GITHUB}") as retriever:
            retriever.set_attributes(
                {
                    "openinference.span.kind": "RETRIEVER",
                    "input.value": TEXT,
                    "retrieval.documents.0.document.id": CARD,
                    "retrieval.documents.0.document.content": f"content {TEXT}",
                    "retrieval.documents.0.document.metadata": metadata,
                    "retrieval.documents.0.document.score": 0.5,
                }
            )
        with tracer.start_as_current_span(f"generate {AWS}") as llm:
            llm.set_attributes(
                {
                    "openinference.span.kind": "LLM",
                    "llm.model_name": f"model {EMAIL}",
                    "llm.input_messages.0.message.role": "user",
                    "llm.input_messages.0.message.content": TEXT,
                    "llm.output_messages.0.message.role": "assistant",
                    "llm.output_messages.0.message.content": f"answer {TEXT}",
                    "llm.token_count.prompt": 30,
                }
            )
            llm.set_status(Status(StatusCode.ERROR, TEXT))
        root.set_attribute("output.value", f"done {TEXT}")
    provider.shutdown()


@pytest.mark.postgres
def test_nothing_collect_takes_in_is_stored_or_logged_unscrubbed(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    service = start_collect(postgres_url, "--trace-idle", "1")
    try:
        _send(service.url)
        (record,) = wait_for_records(engine, 1)
    finally:
        logged = service.stop()
        engine.dispose()
    dump = _dump(postgres_url)
    assert "[REDACTED]" in record.user_input and record.contents
    for secret in SECRETS:
        assert secret not in dump, secret
        assert secret not in logged, secret
