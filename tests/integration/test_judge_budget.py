"""A judge budget holds across several worker processes sharing Postgres: spend stops within
one claimed batch per worker of the cap, non-LLM variants go on, and scoring resumes in the
next period."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from recalltrace.scorers.budget import JudgeBudget
from recalltrace.storage.models import Score
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply, auto_answer

LLM = "judge_context_recall"
PLAIN = "id_based_context_recall"
PER_CALL = 120  # tokens the scripted judge reports for every answer
CAP = 1200
BATCH, CONCURRENCY = 2, 2


def fixed_usage(request: dict[str, Any]) -> Reply:
    reply = auto_answer(request)
    return dataclasses.replace(
        reply, usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": PER_CALL}
    )


def workers(url: str, judge: JudgeServer, count: int) -> list[subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["OPENAI_API_KEY"] = "test-key"
    command = [
        sys.executable, "-m", "recalltrace", "worker", "--once", "--no-progress",
        "--database-url", url, "--metric", LLM, "--metric", PLAIN,
        "--judge-model", "openai/test-judge", "--judge-api-base", judge.base_url,
        "--judge-budget", f"{CAP} tokens/minute",
        "--batch-size", str(BATCH), "--concurrency", str(CONCURRENCY),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def spent(engine: Engine) -> tuple[int, int]:
    """Tokens the LLM variant's stored results spent, and how many there are."""
    with engine.connect() as conn:
        tokens, llm_scores = conn.execute(
            select(
                func.coalesce(func.sum(Score.prompt_tokens + Score.completion_tokens), 0),
                func.count(),
            ).where(Score.metric == LLM)
        ).one()
    return int(tokens), int(llm_scores)


def plain_scores(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(Score.metric == PLAIN)).scalar_one())


def spend_by_minute(engine: Engine) -> dict[datetime, int]:
    """Tokens of the LLM variant's stored results per budget period (the minute of each
    result's ``scored_at``, the worker's own clock, which its budget counts on)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Score.scored_at, Score.prompt_tokens + Score.completion_tokens).where(
                Score.metric == LLM
            )
        ).all()
    periods: dict[datetime, int] = {}
    for scored_at, tokens in rows:
        minute = scored_at.replace(second=0, microsecond=0)
        periods[minute] = periods.get(minute, 0) + int(tokens)
    return periods


def wait_for_minute_after(last: datetime) -> None:
    """Wait (no check of how long) until the minute after ``last`` began."""
    while datetime.now(timezone.utc).replace(second=0, microsecond=0) <= last:
        time.sleep(0.5)


def test_parse_budgets() -> None:
    assert JudgeBudget.parse("50/day") == JudgeBudget(50.0, "usd", "day")
    assert JudgeBudget.parse("$2.5/hour") == JudgeBudget(2.5, "usd", "hour")
    assert JudgeBudget.parse("200k tokens/day") == JudgeBudget(200_000.0, "tokens", "day")
    assert JudgeBudget.parse("2M tokens / minute") == JudgeBudget(2e6, "tokens", "minute")
    for bad in ("50", "0/day", "50/week", "fifty/day", "-1/day"):
        with pytest.raises(ValueError, match="budget"):
            JudgeBudget.parse(bad)


@pytest.mark.postgres
@pytest.mark.realsystem  # several worker processes at once, each with LiteLLM
def test_budget_holds_across_workers_and_resumes_next_period(
    pg_engine: Engine, postgres_url: str
) -> None:
    repo = make_repository(pg_engine, metrics=[LLM, PLAIN])
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(60)])
    # A run may cross into the next minute on a busy host: what holds is counted per period
    # (the minute of each stored result), never against the time a run took.
    slack = (BATCH + CONCURRENCY) * PER_CALL  # what one worker had claimed when the cap hit
    with JudgeServer(handler=fixed_usage) as judge:
        first = workers(postgres_url, judge, 3)
        for run in first:
            assert run.returncode == 0, run.stderr
        periods = spend_by_minute(pg_engine)
        _tokens, scored = spent(pg_engine)
        # Every worker stops claiming once the stored spend of the period reaches the cap;
        # what each had claimed (at most a batch, plus what it holds ready) finishes.
        assert max(periods.values()) >= CAP, periods
        assert all(tokens <= CAP + 3 * slack for tokens in periods.values()), periods
        assert scored < 60
        said = sum("JUDGE BUDGET REACHED" in run.stderr for run in first)
        assert said >= 1
        # Non-LLM variants went on: every trace has its id-based score.
        assert plain_scores(pg_engine) == 60

        # The next minute is a new period: scoring resumes, and stops at the cap again.
        wait_for_minute_after(max(periods))
        second = workers(postgres_url, judge, 1)
        assert second[0].returncode == 0, second[0].stderr
        _tokens, scored_after = spent(pg_engine)
        assert scored_after > scored
        later = {
            minute: t for minute, t in spend_by_minute(pg_engine).items() if minute not in periods
        }
        assert later, "nothing was scored in a new period"
        assert max(later.values()) >= CAP, later
        assert all(tokens <= CAP + slack for tokens in later.values()), later
    repo.dispose()
