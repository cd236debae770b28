"""What a Prometheus scrape of a running worker returns is what docs/worker.md lists.

A real ``recalltrace worker`` process with ``--prometheus-port 0`` scores traces with a judge
(the scripted server) and without; its scrape endpoint is read over HTTP, as Prometheus reads
it. Alerts written from the docs must find their series, and counters must exist at 0 before
their first event (so ``increase()`` sees the first pause and failure ratios read 0).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import start_process

METRICS = ["id_based_context_recall", "judge_context_recall"]
MODEL = "openai/gpt-4o-mini"


def documented_series() -> set[str]:
    """The base names in the Prometheus column of docs/worker.md's metrics table."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "worker.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[1].startswith("`"):
            first = re.findall(r"`([a-z_]+)`", cells[1])[0]
            names.add(re.sub(r"_bucket$", "", first))
    return names


def scraped_series(text: str) -> dict[str, list[str]]:
    """Family base name -> sample lines, for recalltrace's and the GenAI families."""
    families: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if not name.startswith(("rag_", "gen_ai_")):
            continue
        base = re.sub(r"_(bucket|sum|count|created)$", "", name)
        families.setdefault(base, []).append(line)
    return families


@pytest.fixture
def judge_url() -> Iterator[str]:
    process, url = start_process("--latency", "0.01")
    yield url
    process.terminate()
    process.wait(timeout=10)


def test_the_scrape_matches_the_documented_series(tmp_path: Path, judge_url: str) -> None:
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=METRICS)
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(3)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["OPENAI_API_KEY"] = "test-key"
    command = [sys.executable, "-m", "recalltrace", "worker", "--database-url", url]
    command += ["--prometheus-port", "0", "--poll-interval", "0.2", "--no-progress"]
    command += ["--judge-model", MODEL, "--judge-api-base", judge_url]
    for metric in METRICS:
        command += ["--metric", metric]
    worker = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = worker.stdout.readline()
            match = re.search(r"Prometheus metrics on port (\d+)", line)
            if match:
                port = int(match.group(1))
            assert line or worker.poll() is None, worker.stderr.read() if worker.stderr else ""
        assert port is not None
        families: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                families = scraped_series(reply.read().decode())
            scored = [
                line for line in families.get("rag_worker_jobs_total", [])
                if 'rag_job_outcome="scored"' in line and not line.endswith(" 0.0")
            ]  # fmt: skip
            if len(scored) == 2 and "rag_queue_depth" in families:
                break
            time.sleep(0.5)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    documented = documented_series()
    # The judge's price list knows gpt-4o-mini, so the cost counter is there too.
    assert set(families) == documented, (sorted(families), sorted(documented))
    jobs = families["rag_worker_jobs_total"]
    for metric in METRICS:
        for outcome in ("skipped", "failed", "retried"):
            assert any(
                f'rag_metric="{metric}"' in line
                and f'rag_job_outcome="{outcome}"' in line
                and line.endswith(" 0.0")
                for line in jobs
            ), (metric, outcome, jobs)
    paused = families["rag_judge_paused_total"]
    assert [line.rsplit(" ", 1)[1] for line in paused] == ["0.0"]
