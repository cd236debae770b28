"""The standard ``OTEL_*`` variables work as users expect: the endpoint alone exports the
decorators' spans, ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` exports traces, metrics and events over
gRPC, and what cannot be honoured is one clear line at start, never spans sent nowhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver, attributes

APP = """
import sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # this package is not installed
import recalltrace

@recalltrace.retrieval
def search(query):
    return [{"id": "kb-1", "content": "Refunds take 14 days.", "score": 0.8}]

@recalltrace.rag("support-bot")
def answer(question):
    search(question)
    return "14 days."

print(answer("How long do refunds take?"))
print("stored:", recalltrace.flush(10))
"""

NO_GRPC = "opentelemetry.exporter.otlp.proto.grpc"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "OTEL_"))}
    env["RECALLTRACE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'app.db'}"
    env.update(extra)
    return env


def run_app(env: dict[str, str], *blocked: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", APP, *blocked],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_endpoint_alone_exports_the_decorators_spans(tmp_path: Path) -> None:
    with OTLPReceiver() as receiver:
        env = clean_env(
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            RECALLTRACE_GENAI_SPAN_ATTRIBUTES="1",
        )
        done = run_app(env)
        spans = receiver.spans()
    assert done.returncode == 0, done.stderr
    assert "14 days." in done.stdout and "stored: True" in done.stdout
    kinds = {span.name: attributes(span.attributes) for span in spans}
    assert kinds["support-bot"]["openinference.span.kind"] == "CHAIN"
    assert kinds["search"]["retrieval.documents.0.document.id"] == "kb-1"
    # The GenAI conventions' content attributes, asked for from the environment.
    assert kinds["search"]["gen_ai.retrieval.documents"] == '[{"id": "kb-1", "score": 0.8}]'


def test_grpc_exports_traces_and_the_workers_metrics_and_events(tmp_path: Path) -> None:
    with OTLPGrpcReceiver() as receiver:
        env = clean_env(
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        )
        done = run_app(env)
        assert done.returncode == 0, done.stderr
        assert {span.name for span in receiver.spans()} == {"support-bot", "search"}

        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        upgrade(url)
        repo = make_repository(create_engine_from_url(url), metrics=["id_based_context_recall"])
        repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(3)])
        repo.dispose()
        command = [sys.executable, "-m", "recalltrace", "worker", "--once", "--no-progress"]
        command += ["--database-url", url, "--metric", "id_based_context_recall"]
        worker = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
        assert worker.returncode == 0, worker.stderr
        assert "scored 3" in worker.stdout
        jobs = receiver.metric_points("rag.worker.jobs")
        events = receiver.log_records()
    assert jobs, "no metrics arrived over gRPC"
    scored = [
        attributes(e.attributes)["rag.score.status"]
        for e in events
        if e.event_name == "gen_ai.evaluation.result"
    ]
    assert scored == ["scored"] * 3


def test_grpc_without_its_exporter_is_one_line_at_start(tmp_path: Path) -> None:
    env = clean_env(
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4317",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
    )
    # An application calling configure() is told at once.
    configure = (
        f"import sys; sys.modules[{NO_GRPC!r}] = None; import recalltrace\n"
        "try:\n    recalltrace.configure()\nexcept ValueError as exc:\n    print('refused:', exc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", configure], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "refused: OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter" in done.stdout
    assert "pip install opentelemetry-exporter-otlp-proto-grpc" in done.stdout

    # An application that relies on the environment keeps working, untraced, and is told once.
    app = run_app(env, NO_GRPC)
    assert app.returncode == 0, app.stderr
    assert "14 days." in app.stdout
    assert app.stderr.count("needs the gRPC exporter") == 1
    assert "Traceback" not in app.stderr

    # The worker refuses to start with one line instead of exporting nowhere.
    worker = (
        f"import sys; sys.modules[{NO_GRPC!r}] = None\n"
        "from recalltrace.cli import main\n"
        "sys.exit(main(['worker', '--once', '--no-progress', '--database-url', sys.argv[1]]))"
    )
    url = f"sqlite:///{tmp_path / 'w.db'}"
    upgrade(url)
    refused = subprocess.run(
        [sys.executable, "-c", worker, url], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "recalltrace: error: OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: "
        "the grpc extra (pip install '.[grpc]' in a checkout, or "
        "pip install opentelemetry-exporter-otlp-proto-grpc), or unset it to export over HTTP"
    ]


def test_a_protocol_python_cannot_speak_is_refused_by_name(tmp_path: Path) -> None:
    env = clean_env(
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318",
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/json",
    )
    done = subprocess.run(
        [sys.executable, "-c", "import recalltrace; recalltrace.configure()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        "ValueError: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not supported: use "
        "http/protobuf (the default) or grpc"
    ) in done.stderr
