"""``scores cost``: judge tokens and money per day, variant and model, from what a real
worker stored after calling the scripted judge through LiteLLM (priced from LiteLLM's list)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Score
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer

METRIC = "judge_context_recall"


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(OPENAI_API_KEY="test-key", COLUMNS="160")
    return run_cli(*args, "--database-url", url, cwd=ROOT, env=env)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        database = f"sqlite:///{tmp_path / 'cost.db'}"
        upgrade(database)
        return database
    engine = request.getfixturevalue("pg_engine")
    return str(engine.url.render_as_string(hide_password=False))


def test_cost_sums_what_the_judge_calls_spent(url: str) -> None:
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    traces = [make_trace() for _ in range(4)]
    for index, trace in enumerate(traces):  # three on 2.5.0 (one tagged), one on no release
        trace.release = "2.5.0" if index else None
        trace.tags = ["beta"] if index == 1 else []
    repo.write_traces(traces)
    repo.dispose()
    with JudgeServer() as judge:
        worker = run(
            "worker", "--once", "--no-progress", "--metric", METRIC, "--judge-model",
            "openai/gpt-4o-mini", "--judge-api-base", judge.base_url, url=url,
        )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        prompt, completion, cost, n = conn.execute(
            select(
                func.sum(Score.prompt_tokens),
                func.sum(Score.completion_tokens),
                func.sum(Score.cost_usd),
                func.count(),
            )
        ).one()
    engine.dispose()
    assert n == 4 and prompt > 0 and cost > 0

    done = run("scores", "cost", "--format", "json", url=url)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["metric"] == METRIC and row["model"] == "openai/gpt-4o-mini"
    assert (row["scores"], row["prompt_tokens"], row["completion_tokens"]) == (
        4,
        prompt,
        completion,
    )
    assert abs(row["cost_usd"] - cost) < 1e-12 and row["unpriced"] == 0

    table = run("scores", "cost", url=url)
    assert table.returncode == 0, table.stderr
    assert f"Total: {prompt + completion:,} tokens, {cost:.4f} USD" in table.stdout
    nothing = run("scores", "cost", "--metric", "id_based_context_recall", url=url)
    assert "No judge calls" in nothing.stdout

    # Filtered and split by request attribute, the same calls add up.
    released = run("scores", "cost", "--where", "release=2.5.0", "--format", "json", url=url)
    assert released.returncode == 0, released.stderr
    (row,) = json.loads(released.stdout)
    assert row["scores"] == 3
    by_release = run("scores", "cost", "--by", "release", "--format", "json", url=url)
    assert by_release.returncode == 0, by_release.stderr
    rows = json.loads(by_release.stdout)
    assert [(r["release"], r["scores"]) for r in rows] == [("2.5.0", 3), (None, 1)]
    assert sum(r["prompt_tokens"] for r in rows) == prompt
    by_tag = run("scores", "cost", "--by", "tag", "--format", "csv", url=url)
    lines = by_tag.stdout.splitlines()
    assert lines[0].startswith("day,tag,metric,model,scores,")
    assert [line.split(",")[1] for line in lines[1:]] == ["beta", ""]
    table = run("scores", "cost", "--by", "release", url=url)
    assert "(none)" in table.stdout and "2.5.0" in table.stdout
