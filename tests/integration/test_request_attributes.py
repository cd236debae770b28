"""Attributes on a request (release, environment, user, session, tags) from every source, stored
on both backends, scrubbed like any field."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from openinference.instrumentation import using_attributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Trace, TraceTag
from recalltrace.tracer import TracerConfig
from tests.support.tracer_helpers import make_traced


class Ask(BaseModel):
    question: str
    user_email: str


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "sqlite":
        database = f"sqlite:///{tmp_path / 'attrs.db'}"
        upgrade(database)
        yield database
    else:
        engine = request.getfixturevalue("pg_engine")
        yield engine.url.render_as_string(hide_password=False)


def stored(url: str) -> tuple[list[Trace], list[tuple[str, str]]]:
    engine = create_engine_from_url(url)
    with Session(engine) as session:
        traces = list(session.scalars(select(Trace).order_by(Trace.started_at)))
        tags = [(t.trace_id, t.tag) for t in session.scalars(select(TraceTag))]
    engine.dispose()
    return traces, tags


def test_attributes_from_configure_decorator_and_request_are_stored(url: str) -> None:
    make_traced(open_storage=True, database_url=url, release="2.4.1", environment="production")

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return [{"id": "kb-1", "content": "Refunds take 14 days."}]

    # The question is read from the request body; the body (with the e-mail) is not stored.
    @recalltrace.rag("support-bot", input_param=lambda body: body.question, tags=["api"])
    def answer(body: Ask) -> str:
        recalltrace.set_attributes(user_id="u-42", session_id=7, tags=["vip", "api"])
        search(body.question)
        return "14 days."

    @recalltrace.rag("support-bot")
    def canary(question: str) -> str:
        recalltrace.set_attributes(release="2.5.0-rc1", metadata={"experiment": "b"})
        search(question)
        return "14 days."

    assert answer(Ask(question="How long do refunds take?", user_email="a@b.example")) == (
        "14 days."
    )
    canary("How long do refunds take?")
    assert recalltrace.flush(10)
    recalltrace.shutdown(5)
    traces, tags = stored(url)
    first, second = traces
    assert first.user_input == "How long do refunds take?"
    assert "a@b.example" not in repr(first.metadata_)
    assert (first.release, first.environment, first.user_id, first.session_id) == (
        "2.4.1",
        "production",
        "u-42",
        "7",
    )
    assert first.tags == ["api", "vip"]
    assert sorted(tag for trace_id, tag in tags if trace_id == first.trace_id) == ["api", "vip"]
    assert (second.release, second.environment, second.user_id) == (
        "2.5.0-rc1",
        "production",
        None,
    )
    assert second.tags is None
    assert second.metadata_["experiment"] == "b"


def test_release_and_environment_come_from_the_opentelemetry_resource(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'resource.db'}"
    upgrade(url)
    provider = TracerProvider(
        resource=Resource.create(
            {"service.version": "3.0.0", "deployment.environment.name": "staging"}
        )
    )
    make_traced(open_storage=True, database_url=url, tracer_provider=provider)

    @recalltrace.rag
    def answer(question: str) -> str:
        return "ok"

    answer("q")
    assert recalltrace.flush(10)
    recalltrace.shutdown(5)
    (trace,), _ = stored(url)
    assert (trace.release, trace.environment) == ("3.0.0", "staging")


def test_the_environment_variables_name_release_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "service.name=api,service.version=1.2.3,deployment.environment=prod",
    )
    config = TracerConfig.from_env()
    assert (config.service_name, config.release, config.environment) == ("api", "1.2.3", "prod")
    monkeypatch.setenv("RECALLTRACE_RELEASE", "1.2.4")
    assert TracerConfig.from_env().release == "1.2.4"


def test_set_attributes_outside_a_request_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    from recalltrace.tracer import _runtime

    make_traced()
    monkeypatched = _runtime._outside_said
    _runtime._outside_said = False
    try:
        with caplog.at_level(logging.WARNING, logger="recalltrace"):
            assert recalltrace.set_attributes(user_id="u-1") is False
            assert recalltrace.set_attributes(user_id="u-1") is False
        said = [r for r in caplog.records if "outside any @recalltrace.rag" in r.getMessage()]
        assert len(said) == 1
    finally:
        _runtime._outside_said = monkeypatched
        recalltrace.shutdown(2)


def test_secrets_in_attributes_are_scrubbed() -> None:
    traced = make_traced()

    @recalltrace.rag
    def answer(question: str) -> str:
        recalltrace.set_attributes(
            user_id="jane.doe@example.com",
            session_id="sk-abcdefghijklmnopqrstuvwxyz123456",
            tags=["ghp_abcdefghijklmnopqrstuvwxyz0123456789"],
        )
        return "ok"

    answer("q")
    record = traced.record()
    recalltrace.shutdown(2)
    text = repr((record.user_id, record.session_id, record.tags))
    assert "jane.doe@example.com" not in text
    assert "abcdefghijklmnopqrstuvwxyz123456" not in text
    assert "abcdefghijklmnopqrstuvwxyz0123456789" not in text
    assert "REDACTED" in text


def test_captured_spans_carry_user_session_and_tags() -> None:
    traced = make_traced(capture_spans=True)
    tracer = traced.provider.get_tracer("vendor")
    from openinference.instrumentation import get_attributes_from_context

    with (
        using_attributes(session_id="conv-9", user_id="u-7", tags=["mobile", "beta"]),
        tracer.start_as_current_span(
            "chain",
            attributes={"openinference.span.kind": "CHAIN", "input.value": "question?"},
        ) as root,
    ):
        # OpenInference instrumentors copy the context's attributes onto their spans.
        root.set_attributes(dict(get_attributes_from_context()))
        with tracer.start_as_current_span(
            "retrieve",
            attributes={
                "openinference.span.kind": "RETRIEVER",
                "retrieval.documents.0.document.id": "kb-1",
                "retrieval.documents.0.document.content": "text",
            },
        ):
            pass
        root.set_attribute("output.value", "answer")
    record = traced.record()
    recalltrace.shutdown(2)
    assert (record.user_id, record.session_id, record.tags) == ("u-7", "conv-9", ["mobile", "beta"])


def test_trace_show_prints_the_attributes(tmp_path: Any) -> None:
    import json

    from tests.support import ROOT
    from tests.support.cli import run_cli

    url = f"sqlite:///{tmp_path / 'show.db'}"
    upgrade(url)
    make_traced(open_storage=True, database_url=url, release="2.4.1")

    @recalltrace.rag
    def answer(question: str) -> str:
        recalltrace.set_attributes(user_id="u-42", tags=["beta"])
        return "ok"

    answer("q")
    assert recalltrace.flush(10)
    recalltrace.shutdown(5)
    (trace,), _ = stored(url)
    shown = run_cli("trace", "show", trace.trace_id, "--database-url", url, "--format", "json",
                    cwd=ROOT)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["attributes"] == {
        "release": "2.4.1",
        "user_id": "u-42",
        "tags": ["beta"],
    }
    table = run_cli("trace", "show", trace.trace_id, "--database-url", url, cwd=ROOT)
    assert "release" in table.stdout and "2.4.1" in table.stdout and "u-42" in table.stdout


def test_captured_requests_take_release_and_environment_from_their_resource() -> None:
    provider = TracerProvider(
        resource=Resource.create(
            {"service.version": "7.0.0", "deployment.environment": "canary"}  # the older key
        )
    )
    traced = make_traced(capture_spans=True, tracer_provider=provider)
    tracer = provider.get_tracer("vendor")
    with (
        tracer.start_as_current_span(
            "chain", attributes={"openinference.span.kind": "CHAIN", "input.value": "q?"}
        ),
        tracer.start_as_current_span(
            "retrieve",
            attributes={
                "openinference.span.kind": "RETRIEVER",
                "retrieval.documents.0.document.content": "text",
            },
        ),
    ):
        pass
    record = traced.record()
    recalltrace.shutdown(2)
    assert (record.release, record.environment) == ("7.0.0", "canary")
