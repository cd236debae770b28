"""A cron user's ``worker --once`` exporting over OTLP, read by a receiver built on the
OpenTelemetry proto package: the run's last export carries the queue it left behind (not the
one it found), and jobs skipped because their reference never came are counted and have their
evaluation events."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.otlp_receiver import OTLPReceiver

METRIC = "id_based_context_recall"


def test_a_once_run_exports_the_queue_it_left_and_its_skips(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cron.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(6)])
    # Four requests whose reference ids never arrive: their jobs wait, then are skipped.
    repo.write_traces([make_trace(reference=None) for _ in range(4)])
    assert repo.queue_stats().due == 6 and repo.queue_stats().waiting == 4
    repo.dispose()
    time.sleep(1.5)

    with OTLPReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "OTEL_"))}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        command = [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url]
        command += ["--metric", METRIC, "--reference-ttl", "1", "--no-progress"]
        run = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr
        assert "scored 6, skipped 4, failed 0" in run.stdout
        queue = receiver.metric_points("rag.queue.depth")
        jobs = receiver.metric_points("rag.worker.jobs")
        events = receiver.log_records()

    assert queue, "no queue gauge was exported"
    last = {
        point["rag.job.state"]: value
        for point, value in queue[-1]
        if point.get("rag.metric") == METRIC
    }
    assert last == {"due": 0, "running": 0, "waiting": 0, "failed": 0}
    outcomes = {
        point["rag.job.outcome"]: value
        for point, value in jobs[-1]
        if point.get("rag.metric") == METRIC
    }
    assert outcomes == {"scored": 6, "skipped": 4, "failed": 0, "retried": 0}

    from tests.support.otlp_receiver import attributes

    statuses = [attributes(r.attributes).get("rag.score.status") for r in events]
    assert statuses.count("scored") == 6 and statuses.count("skipped") == 4
    skipped = [attributes(r.attributes) for r in events]
    skipped = [a for a in skipped if a.get("rag.score.status") == "skipped"]
    assert all(a["gen_ai.evaluation.name"] == METRIC for a in skipped)
    assert all("reference" in a["gen_ai.evaluation.explanation"] for a in skipped)


def test_evaluation_events_point_at_the_request_they_judge(tmp_path: Path) -> None:
    """A record has its own id; its events carry the OpenTelemetry trace and root span the
    request ran in, so a trace viewer shows the score on that request."""
    url = f"sqlite:///{tmp_path / 'linked.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    records = [make_trace(reference_context_ids=["doc_0"]) for _ in range(3)]
    for index, record in enumerate(records):
        record.otel_trace_id = f"{index + 1:032x}"
        record.otel_span_id = f"{index + 10:016x}"
    repo.write_traces(records)
    repo.dispose()
    started_ns = time.time_ns()
    with OTLPReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "OTEL_"))}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        command = [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url]
        run = subprocess.run(
            [*command, "--metric", METRIC, "--no-progress"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        events = receiver.log_records()
    from tests.support.otlp_receiver import attributes

    linked = {
        attributes(e.attributes)["rag.record.id"]: (e.trace_id.hex(), e.span_id.hex())
        for e in events
    }
    assert linked == {r.trace_id: (r.otel_trace_id, r.otel_span_id) for r in records}
    # Each event says when it was scored, and a label beside the value.
    for event in events:
        assert started_ns <= event.time_unix_nano <= time.time_ns()
        assert event.observed_time_unix_nano == event.time_unix_nano
        values = attributes(event.attributes)
        assert values["gen_ai.evaluation.score.value"] == 1.0
        assert values["gen_ai.evaluation.score.label"] == "complete"
