"""At 80 columns the history tables never cut a key cell (a day, a release, a metric, a model):
``scores cost``, ``scores summary --by release`` and ``scores compare``; and ``scores cost``
words the results without a cost for what they are."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from recalltrace.cli import main
from recalltrace.scorers import ScoreResult
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support.factories import make_repository, make_trace

RELEASES = ("2026.11.17", "2026.11.24-hotfix.3")
MODEL = "openai/gpt-4o-mini"


def cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    assert code == 0, err.getvalue()
    return code, out.getvalue()


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    database = f"sqlite:///{tmp_path / 'narrow.db'}"
    upgrade(database)
    metrics = ["chunk_context_recall", "context_entity_recall", "judge_context_recall"]
    repo = make_repository(create_engine_from_url(database), metrics=metrics)
    traces = [make_trace(reference_context_ids=["doc_0"]) for _ in range(24)]
    for index, trace in enumerate(traces):
        trace.release = RELEASES[index % 2]
    repo.write_traces(traces)
    for job in repo.claim_jobs("w", limit=1000, lease=timedelta(minutes=1)):
        result: Any
        if job.metric == "judge_context_recall":
            # Skipped before asking the judge: the model is recorded, no call was made.
            result = ScoreResult(
                metric=job.metric, value=None, status="skipped", reason="no reference", model=MODEL
            )
        else:
            value = 0.9 if job.metric == "chunk_context_recall" else 0.4
            result = ScoreResult(
                metric=job.metric, value=value, status="scored", reason="ok", model=MODEL,
                prompt_tokens=1_234_567, completion_tokens=23_456, cost_usd=0.1234,
            )  # fmt: skip
        repo.finish_job(job, result)
    repo.dispose()
    return database


def _no_key_cut(out: str, keys: list[str]) -> None:
    assert "…" not in out, out
    for key in keys:
        assert key in out, (key, out)
    assert all(len(line) <= 80 for line in out.splitlines()), out


def test_cost_at_80_columns_cuts_no_key(url: str) -> None:
    today = datetime.now(timezone.utc).date().isoformat()
    for extra in ((), ("--by", "release")):
        _code, out = cli("scores", "cost", *extra, "--database-url", url)
        _no_key_cut(out, [today, "chunk_context_recall", "context_entity_recall", MODEL])
        if extra:
            _no_key_cut(out, list(RELEASES))


def test_summary_by_release_at_80_columns_cuts_no_key(url: str) -> None:
    today = datetime.now(timezone.utc).date().isoformat()
    _code, out = cli("scores", "summary", "--by", "release", "--database-url", url)
    _no_key_cut(out, [today, *RELEASES, "chunk_context_recall", "judge_context_recall"])


def test_compare_at_80_columns_cuts_no_key(url: str) -> None:
    _code, out = cli(
        "scores", "compare", "--metric", "chunk_context_recall", "--by", "release",
        "--min-traces", "2", "--database-url", url,
    )  # fmt: skip
    _no_key_cut(out, list(RELEASES))


def test_cost_says_which_results_made_no_judge_call(url: str) -> None:
    _code, out = cli("scores", "cost", "--database-url", url)
    assert "unpriced" not in out
    judge_block = out[out.index("judge_context_recall") :]
    assert "no judge call" in judge_block.splitlines()[0] or "no judge call" in judge_block
    assert "24 result(s) without a cost" in " ".join(out.split()), out
    assert "made no judge call" in " ".join(out.split())
