"""Jobs no worker will ever run, as an operator meets them: a real worker scores some variants,
the jobs of the others are named as unserved (by the worker and by ``jobs list``), counted per
variant, and ended by ``jobs cancel``; ``jobs list`` fits an 80-column terminal."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from datetime import datetime, timedelta, timezone

from sqlalchemy import text, update

from recalltrace.scorers import ScoreResult
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import ScoringJob
from recalltrace.storage.repository import Repository
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace

SERVED = "id_based_context_recall"
UNSERVED = "non_llm_context_recall"


def run(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RECALLTRACE_DATABASE_URL"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return run_cli(*args, env=env)


def seed(url: str, traces: int) -> Repository:
    repo = make_repository(create_engine_from_url(url), metrics=[SERVED, UNSERVED])
    repo.write_traces(
        [
            make_trace(
                reference_context_ids=["doc_0", "doc_9"],
                reference_contexts=["Paris is the capital of France."],
            )
            for _ in range(traces)
        ]
    )
    return repo


def test_unserved_jobs_are_named_counted_and_cancelled(database_url: str) -> None:
    repo = seed(database_url, 7)
    worker = run(
        "worker", "--once", "--metric", SERVED, "--database-url", database_url, "--no-progress"
    )
    assert worker.returncode == 0, worker.stderr
    # The worker says, once and with the exact number, that nobody scores the other variant.
    said = [line for line in worker.stderr.splitlines() if "no running worker serves" in line]
    assert len(said) == 1, worker.stderr
    assert f"7 queued jobs of variant no running worker serves: {UNSERVED} (7)" in said[0]
    # Its fixes are commands that run as printed (a non-LLM variant needs no judge).
    assert re.findall(r"`(recalltrace [^`]+)`", said[0]) == [
        f"recalltrace worker --metric {UNSERVED}",
        f"recalltrace jobs cancel --metric {UNSERVED}",
    ]

    # The jobs have been due for an hour: late for a variant nobody serves, not "overdue".
    with repo.engine.begin() as conn:
        conn.execute(
            update(ScoringJob)
            .where(ScoringJob.metric == UNSERVED)
            .values(run_at=datetime.now(timezone.utc) - timedelta(hours=1))
        )
    listed = run("jobs", "list", "--format", "json", "--database-url", database_url)
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)
    assert len(jobs) == 7
    assert {(j["metric"], j["problem"]) for j in jobs} == {(UNSERVED, "unserved")}

    counts = run("jobs", "counts", "--format", "json", "--database-url", database_url)
    by_metric = {c["metric"]: c for c in json.loads(counts.stdout)}
    assert by_metric[UNSERVED]["queued"] == 7
    assert by_metric[UNSERVED]["live_workers"] == 0
    assert by_metric[UNSERVED]["last_worker_seen_at"] is None
    # The worker that ran is known (stopped now), so its variant reads "last seen".
    assert SERVED not in by_metric or by_metric[SERVED]["last_worker_seen_at"] is not None

    table = run("jobs", "list", "--database-url", database_url, columns=80)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), table.stdout
    assert any(line.startswith(UNSERVED) and line.rstrip().endswith("unserved") for line in lines)
    assert f"{UNSERVED}: 7 unserved" in table.stdout
    printed = re.findall(r"`(recalltrace [^`]+)`", " ".join(table.stdout.split()))
    assert f"recalltrace jobs cancel --metric {UNSERVED}" in printed, table.stdout

    refused = run("jobs", "cancel", "--database-url", database_url)
    assert refused.returncode == 2
    assert "say which jobs to cancel" in refused.stderr and "Traceback" not in refused.stderr

    # The printed command, as printed (the database given as the test's).
    cancel = shlex.split(f"recalltrace jobs cancel --metric {UNSERVED}")[1:]
    cancelled = run(*cancel, "--database-url", database_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"cancelled 7 jobs ({UNSERVED}: 7)\n"
    after = json.loads(
        run("jobs", "list", "--format", "json", "--database-url", database_url).stdout
    )
    assert after == []
    counts_after = {
        c["metric"]: c
        for c in json.loads(
            run("jobs", "counts", "--format", "json", "--database-url", database_url).stdout
        )
    }
    assert counts_after[UNSERVED]["queued"] == 0
    assert counts_after[UNSERVED]["cancelled"] == 7
    # Cancelled jobs are not queued again by a later worker run, nor by a backfill.
    run("backfill", "--metric", UNSERVED, "--database-url", database_url)
    with repo.engine.connect() as conn:
        statuses = conn.execute(
            text("SELECT DISTINCT status FROM scoring_jobs WHERE metric = :m"), {"m": UNSERVED}
        ).all()
    assert statuses == [("cancelled",)]
    repo.dispose()


def test_a_job_that_failed_on_its_first_try_shows_one_attempt(database_url: str) -> None:
    repo = seed(database_url, 2)
    first, second = repo.claim_jobs("w", limit=5, lease=timedelta(minutes=1), metrics=[SERVED])
    # The two ways a job fails for good on its first try: its failed result is stored, or
    # (when even that cannot be written) the job alone is marked failed.
    failed = ScoreResult(
        metric=SERVED, value=None, status="failed", reason="The judge answered nonsense."
    )
    repo.finish_jobs([(first, failed)])
    repo.fail_job(second, "The scorer raised ValueError")
    listed = json.loads(
        run("jobs", "list", "--format", "json", "--database-url", database_url).stdout
    )
    assert sorted((j["problem"], j["attempts"]) for j in listed) == [("failed", 1)] * 2
    repo.dispose()


def test_a_mistyped_app_is_refused_by_the_commands_that_change_jobs(database_url: str) -> None:
    """``jobs retry``, ``jobs cancel`` and ``backfill`` with an --app no stored trace has said
    they did nothing and exited 0; they name the apps there are and the closest one."""
    seed(database_url, 2)
    for command in (["jobs", "retry"], ["jobs", "cancel"], ["backfill", "--since", "30d"]):
        done = run(*command, "--app", "suport-bot", "--database-url", database_url)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        line = done.stderr.strip().splitlines()[-1]
        assert "no stored trace has app 'suport-bot'" in line, line
        assert "did you mean support-bot?" in line, line
        right = run(*command, "--app", "support-bot", "--database-url", database_url)
        assert right.returncode == 0, (command, right.stderr)


def test_the_fixes_for_llm_variants_name_a_judge_and_cancel_several(database_url: str) -> None:
    """Jobs of LLM variants need a worker with a judge model: the printed fix says so (a worker
    with only --metric would refuse them), and one cancel command ends every variant named."""
    repo = make_repository(
        create_engine_from_url(database_url), metrics=["chunk_context_recall", SERVED]
    )
    repo.write_traces([make_trace() for _ in range(3)])
    worker = run("worker", "--once", "--database-url", database_url, "--no-progress")
    said = [line for line in worker.stderr.splitlines() if "no running worker serves" in line]
    assert len(said) == 1, worker.stderr
    printed = re.findall(r"`(recalltrace [^`]+)`", said[0])
    assert printed[0].startswith("recalltrace worker --judge-model "), printed
    assert printed[0].endswith("--metric chunk_context_recall"), printed
    assert printed[-1] == "recalltrace jobs cancel --metric chunk_context_recall"
    repo.write_traces([make_trace() for _ in range(2)])
    both = run(
        "jobs", "cancel", "--metric", "chunk_context_recall", "--metric", SERVED,
        "--database-url", database_url,
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    # make_trace() holds no reference: its id-based jobs wait for one, and are ended too.
    assert both.stdout == f"cancelled 10 jobs (chunk_context_recall: 5, {SERVED}: 5)\n"
    repo.dispose()
