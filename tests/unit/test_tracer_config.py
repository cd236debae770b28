"""Configuration from the environment, TracerProvider choices, and a cheap
``import recalltrace``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import recalltrace
from recalltrace.tracer._config import parse_sample_rates
from tests.support import ROOT


def test_defaults_from_recalltrace_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLTRACE_DATABASE_URL", "postgresql+psycopg://db/rag")
    monkeypatch.setenv("RECALLTRACE_SERVICE_NAME", "support-api")
    monkeypatch.setenv("RECALLTRACE_SAMPLE_RATE", "0.25")
    monkeypatch.setenv("RECALLTRACE_SAMPLE_RATES", "bot=1, search = 0.5")
    monkeypatch.setenv("RECALLTRACE_MAX_QUEUE_SIZE", "99")
    monkeypatch.setenv("RECALLTRACE_FLUSH_INTERVAL", "0.5")
    monkeypatch.setenv("RECALLTRACE_SCRUBBING", "0")
    monkeypatch.setenv("RECALLTRACE_TRACER_PROVIDER", "global")
    config = recalltrace.TracerConfig.from_env()
    assert config.database_url == "postgresql+psycopg://db/rag"
    assert config.service_name == "support-api"
    assert config.sample_rate == 0.25
    assert dict(config.sample_rates) == {"bot": 1.0, "search": 0.5}
    assert config.max_queue_size == 99
    assert config.flush_interval == 0.5
    assert config.scrubbing is False
    assert config.tracer_provider == "global"
    assert config.enabled is True


def test_standard_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RECALLTRACE_SERVICE_NAME", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.name=rag")
    assert recalltrace.TracerConfig.from_env().service_name == "rag"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    assert recalltrace.TracerConfig.from_env().service_name == "from-otel"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert recalltrace.TracerConfig.from_env().enabled is False


def test_keyword_overrides_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLTRACE_SAMPLE_RATE", "0.5")
    assert recalltrace.TracerConfig.from_env(sample_rate=0.1, sink=None).sample_rate == 0.1
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        recalltrace.TracerConfig.from_env(sample_rate=1.5)
    with pytest.raises(ValueError, match="app 'bot'"):
        recalltrace.TracerConfig.from_env(sample_rates={"bot": -0.1})
    with pytest.raises(ValueError, match="max_queue_size"):
        recalltrace.TracerConfig.from_env(max_queue_size=0)
    with pytest.raises(TypeError, match="unknown tracer option"):
        recalltrace.TracerConfig.from_env(sample_ratio=0.1)


def test_bad_environment_values_are_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RECALLTRACE_SAMPLE_RATE", "half")
    monkeypatch.setenv("RECALLTRACE_SAMPLE_RATES", "no-equals-sign")
    config = recalltrace.TracerConfig.from_env()
    assert config.sample_rate == 1.0 and dict(config.sample_rates) == {}
    assert "RECALLTRACE_SAMPLE_RATE" in caplog.text
    assert "RECALLTRACE_SAMPLE_RATES" in caplog.text


def test_parse_sample_rates() -> None:
    assert parse_sample_rates("a=0.1,b=1,,") == {"a": 0.1, "b": 1.0}
    assert parse_sample_rates("name=with=equals=0.3") == {"name=with=equals": 0.3}


def _run(script: str, tmp_path: Path) -> str:
    code = textwrap.dedent(script)
    # The scripts import tests.support: the repository root is where that package lives.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


APP_PROVIDER = """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import recalltrace
    from tests.support.tracer_helpers import MemorySink

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    @recalltrace.retrieval
    def search(q):
        return ["doc"]

    @recalltrace.rag
    def answer(q):
        app = trace.get_tracer("app")
        with app.start_as_current_span("app.work"):
            search(q)
        return "a"
"""


def test_auto_joins_the_applications_provider(tmp_path: Path) -> None:
    out = _run(
        APP_PROVIDER
        + """
    trace.set_tracer_provider(provider)
    sink = MemorySink()
    recalltrace.configure(sink=sink)
    answer("q")
    recalltrace.flush(5)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["search"].parent.span_id == spans["app.work"].context.span_id
    assert spans["app.work"].parent.span_id == spans["answer"].context.span_id
    assert sink.records[0].otel_trace_id == format(spans["answer"].context.trace_id, "032x")
    print(sorted(spans))
    """,
        tmp_path,
    )
    assert out == "['answer', 'app.work', 'search']"


def test_global_joins_a_provider_installed_later(tmp_path: Path) -> None:
    out = _run(
        APP_PROVIDER
        + """
    sink = MemorySink()
    recalltrace.configure(sink=sink, tracer_provider="global")
    trace.set_tracer_provider(provider)  # the application sets up OpenTelemetry afterwards
    answer("q")
    recalltrace.flush(5)
    print(sorted(s.name for s in exporter.get_finished_spans()), len(sink.records))
    """,
        tmp_path,
    )
    assert out == "['answer', 'app.work', 'search'] 1"


def test_own_provider_is_installed_when_the_app_has_none(tmp_path: Path) -> None:
    out = _run(
        APP_PROVIDER
        + """
    sink = MemorySink()
    recalltrace.configure(sink=sink, service_name="own-service")
    installed = trace.get_tracer_provider()
    answer("q")
    recalltrace.flush(5)
    record = sink.records[0]
    recalltrace.configure(sink=sink, tracer_provider="own")  # again: the same provider is kept
    print(type(installed).__name__, installed.resource.attributes["service.name"],
          record.service_name, trace.get_tracer_provider() is installed)
    """,
        tmp_path,
    )
    assert out == "TracerProvider own-service own-service True"


def test_no_opentelemetry_sdk_still_records_traces(tmp_path: Path) -> None:
    # Joining a global provider that is never set: spans do not record, records still flow.
    out = _run(
        APP_PROVIDER
        + """
    sink = MemorySink()
    recalltrace.configure(sink=sink, tracer_provider="global")
    answer("q")
    recalltrace.flush(5)
    (record,) = sink.records
    print(len(record.trace_id), record.retrieved_contexts[0].content, record.response)
    """,
        tmp_path,
    )
    assert out == "32 doc a"


def _imported(statement: str) -> dict[str, int]:
    """Every module ``python -c statement`` imports, with its cumulative import time."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    modules = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if cumulative.strip().isdigit():
            modules[name.strip()] = int(cumulative)
    return modules


def test_import_is_cheap(tmp_path: Path) -> None:
    """``import recalltrace`` loads none of the heavy libraries and few modules at all (counted,
    not timed: a count does not depend on how busy the machine is)."""
    modules = _imported("import recalltrace")
    heavy = [
        name
        for name in modules
        if name.split(".")[0] in {"litellm", "sqlalchemy", "opentelemetry", "alembic", "psycopg"}
    ]
    assert heavy == []
    added = sorted(set(modules) - set(_imported("pass")))
    # About 60 today (two dozen of them recalltrace's own); SQLAlchemy alone would add 80 more.
    assert len(added) < 100, added
