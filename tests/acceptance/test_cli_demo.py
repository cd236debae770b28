"""``recalltrace demo`` as a newcomer runs it: SQLite with no server, Postgres, and a judge."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import Score, Trace
from tests.support.cli import run_cli
from tests.support.judge_server import JudgeServer
from tests.support.postgres import truncate_all


def run_demo(*args: str, cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    """``recalltrace demo ARGS`` (the command line, in process) in ``cwd``: its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(extra_env or {})
    result = run_cli("demo", *args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stdout


def score_counts(url: str, status: str = "scored") -> dict[str, int]:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Score.metric, func.count()).where(Score.status == status).group_by(Score.metric)
        ).all()
        traces = conn.scalar(select(func.count()).select_from(Trace))
    engine.dispose()
    counts = {metric: n for metric, n in rows}
    counts["traces"] = int(traces or 0)
    return counts


def test_demo_on_the_embedded_default_without_a_judge(tmp_path: Path) -> None:
    out = run_demo(cwd=tmp_path)
    assert (tmp_path / "recalltrace.db").exists()
    assert "Traced 72 help-desk requests (36 with references attached afterwards)" in out
    assert re.search(r"non_llm_context_recall\s+│\s+none\s+│\s+72\s+│\s+[01]\.\d\d", out), out
    assert re.search(r"llm_context_recall\s+│\s+LLM\s+│\s+-\s+│\s+not configured", out), out
    assert "--judge-model" in out
    assert "Lowest-scoring traces" in out
    counts = score_counts(f"sqlite:///{tmp_path / 'recalltrace.db'}")
    assert counts == {"traces": 72, "non_llm_context_recall": 72, "id_based_context_recall": 72}
    # The output ends with the diagnose line naming the planted causes: the mobile app's stale
    # index and the article never indexed.
    last = out.strip().splitlines()[-1]
    assert last.startswith(
        "Why: recalltrace scores diagnose --metric id_based_context_recall --since 1d names "
        "tag=mobile-app (recall 0.17 against 0.67 elsewhere, 36 requests)"
    ), out[-1500:]
    assert "never retrieved" in last and "kb-031" in last
    # The printed trace id is real: `trace show` finds it.
    trace_id = re.search(r"recalltrace trace show ([0-9a-f]{32})", out)
    assert trace_id
    shown = run_cli("trace", "show", trace_id.group(1), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr


def test_demo_with_a_judge_scores_every_variant(tmp_path: Path) -> None:
    with JudgeServer() as server:
        out = run_demo(
            "--judge-model",
            "openai/test-judge",
            "--judge-api-base",
            server.base_url,
            cwd=tmp_path,
            extra_env={"OPENAI_API_KEY": "test-key"},
        )
        calls = server.call_count
    assert "not configured" not in out
    url = f"sqlite:///{tmp_path / 'recalltrace.db'}"
    counts = score_counts(url)
    skipped = score_counts(url, "skipped")
    assert score_counts(url, "failed") == {"traces": 72}
    assert counts["traces"] == 72
    # Eighteen requests (four questions, mostly from the mobile app's stale index) retrieve
    # nothing; chunk recall has no chunk to judge there and says so.
    assert skipped == {"traces": 72, "chunk_context_recall": 18}
    counts["chunk_context_recall"] += skipped["chunk_context_recall"]
    for metric in (
        "llm_context_recall",
        "non_llm_context_recall",
        "id_based_context_recall",
        "context_entity_recall",
        "chunk_context_recall",
        "judge_context_recall",
    ):
        assert counts.get(metric) == 72, (metric, counts)
    # One judge call per trace and LLM variant, except on the 18 traces that retrieved
    # nothing: there only entity recall asks (about the reference alone), once per distinct
    # reference (four), whose entities the reference cache then keeps.
    assert calls == 54 * 4 + 4


@pytest.mark.postgres
def test_demo_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    engine.dispose()
    out = run_demo("--database-url", postgres_url, cwd=tmp_path)
    assert "postgresql+psycopg://" in out
    assert not (tmp_path / "recalltrace.db").exists()
    counts = score_counts(postgres_url)
    assert counts["traces"] == 72
    assert counts["id_based_context_recall"] == 72
    assert "names tag=mobile-app" in out.strip().splitlines()[-1]


def test_the_demo_does_not_follow_an_exported_database_url(tmp_path: Path) -> None:
    """An exported RECALLTRACE_DATABASE_URL is a real deployment's database: the demo must not
    write its traces there nor score that database's pending jobs."""
    production = tmp_path / "production.db"
    url = f"sqlite:///{production}"
    out = run_demo(cwd=tmp_path, extra_env={"RECALLTRACE_DATABASE_URL": url})
    assert "Not using RECALLTRACE_DATABASE_URL" in out
    assert not production.exists()
    assert (tmp_path / "recalltrace.db").exists()


def test_an_interrupted_demo_exits_non_zero(tmp_path: Path) -> None:
    import signal
    import time

    with JudgeServer(latency=10.0) as judge:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
        env["OPENAI_API_KEY"] = "test-key"
        demo = subprocess.Popen(
            [sys.executable, "-m", "recalltrace", "demo", "--judge-model", "openai/test-judge",
             "--judge-api-base", judge.base_url],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert demo.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            if line.startswith("Traced") or not line:
                break
        # Interrupt while scoring: once a judge call is in flight (however loaded the machine).
        while time.monotonic() < deadline and judge.call_count == 0:
            time.sleep(0.1)
        assert judge.call_count > 0, "the demo never reached the judge"
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=120)
    assert demo.returncode == 130, err[-2000:]
    assert "Interrupted by SIGINT" in out, (out, err[-3000:])


@pytest.mark.parametrize("exported", [False, True])
def test_every_command_the_demo_prints_runs_as_printed(tmp_path: Path, exported: bool) -> None:
    """Look closer, History and Why, copied from an 80-column terminal (each on one line) and
    run where the demo ran, in the same environment: also with RECALLTRACE_DATABASE_URL
    exported (naming another database, which the demo does not use and its commands must not
    read)."""
    import shlex

    extra = {"COLUMNS": "80"}
    if exported:
        extra["RECALLTRACE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'production.db'}"
    out = run_demo(cwd=tmp_path, extra_env=extra)
    commands = {}
    for line in out.splitlines():
        for label in ("Look closer: ", "History: ", "Why: "):
            if line.startswith(label):
                commands[label] = line[len(label) :].split(" names ")[0]
    assert set(commands) == {"Look closer: ", "History: ", "Why: "}, out[-2000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(extra)
    for label, command in commands.items():
        words = shlex.split(command)
        assert words[0] == "recalltrace", command
        if exported:
            assert "--database-url" in words, command
        done = run_cli(*words[1:], cwd=tmp_path, env=env)
        assert done.returncode == 0, (label, command, done.stderr)
        assert "help-desk" in done.stdout or "Q:" in done.stdout or "trace" in done.stdout, (
            label,
            done.stdout[-1500:],
        )
    assert not (tmp_path / "production.db").exists()
