"""Worker processes killed with SIGKILL at random points, round after round.

Each round starts two ``recalltrace worker`` processes on Postgres against the scripted judge
server (its own process) and kills both with SIGKILL at random moments once they are scoring —
mid-claim, mid-judge-call, mid-write. A last worker then runs until nothing is due. The final
set of scores must equal the expected set exactly: every (trace, metric) once, each with the
value the scorers give for it, whatever was interrupted on the way.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from recalltrace import scorers
from recalltrace.storage.models import JobStatus, Score
from tests.reliability.helpers import job_statuses, spawn, start_judge, worker_args
from tests.support.factories import make_repository, make_trace

# The real-system stage (worker kill rounds).
pytestmark = [pytest.mark.postgres, pytest.mark.realsystem]

METRICS = ["non_llm_context_recall", "id_based_context_recall", "judge_context_recall"]
JUDGE_SCORE = 0.8  # what ``auto_answer`` gives every judge_context_recall request
LEASE_S = 1.0


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    proc, url = start_judge("--latency", "0.05")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def metric_args() -> list[str]:
    return [arg for metric in METRICS for arg in ("--metric", metric)]


def start_worker(url: str, judge_url: str, *extra: str) -> subprocess.Popen[str]:
    return spawn(
        worker_args(
            url,
            "--poll-interval", "0.1", "--lease", str(LEASE_S), "--concurrency", "16",
            "--batch-size", "8", *metric_args(), *extra,
            judge_url=judge_url,
        )
    )  # fmt: skip


def wait_until_scoring(proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Block until the worker printed its start line (LiteLLM imported, loop about to run)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "scoring" in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(
                f"worker exited early: {proc.stderr.read() if proc.stderr else ''}"
            )
    raise AssertionError("worker did not start")


def expected_scores(traces: list[Any]) -> dict[tuple[str, str], float]:
    non_llm = scorers.get("non_llm_context_recall")
    id_based = scorers.get("id_based_context_recall")
    expected: dict[tuple[str, str], float] = {}
    for trace in traces:
        contexts = [c.content for c in trace.retrieved_contexts]
        ids = [c.id for c in trace.retrieved_contexts]
        first = non_llm.score(
            retrieved_contexts=contexts, reference_contexts=trace.reference_contexts
        )
        second = id_based.score(
            retrieved_context_ids=ids, reference_context_ids=trace.reference_context_ids
        )
        assert first.value is not None and second.value is not None
        expected[(trace.trace_id, "non_llm_context_recall")] = first.value
        expected[(trace.trace_id, "id_based_context_recall")] = second.value
        expected[(trace.trace_id, "judge_context_recall")] = JUDGE_SCORE
    return expected


def run_kill_rounds(
    pg_engine: Any, postgres_url: str, judge_url: str, *, rounds: int, traces: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    repo = make_repository(pg_engine, metrics=METRICS)
    written = [
        make_trace(
            contexts=3,
            context_chars=80,
            reference_contexts=[f"Paris is the capital of France ({i % 7})."],
            reference_context_ids=[f"doc_{i % 4}", "doc_9"],
        )
        for i in range(traces)
    ]
    for start in range(0, len(written), 500):
        repo.write_traces(written[start : start + 500])
    expected = expected_scores(written)
    kills = 0
    progress = []
    for _ in range(rounds):
        procs = [start_worker(postgres_url, judge_url) for _ in range(2)]
        try:
            for proc in procs:
                wait_until_scoring(proc)
            for proc in procs:
                time.sleep(rng.uniform(0.05, 1.2))
                proc.send_signal(signal.SIGKILL)
                kills += 1
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate(timeout=30)
        statuses = job_statuses(pg_engine)
        progress.append(statuses.get(JobStatus.DONE, 0))
    time.sleep(LEASE_S + 0.5)  # the killed workers' leases expire
    last = start_worker(postgres_url, judge_url, "--once")
    _out, err = last.communicate(timeout=300)
    assert last.returncode == 0, err[-3000:]
    with pg_engine.connect() as conn:
        rows = conn.execute(select(Score.trace_id, Score.metric, Score.status, Score.value)).all()
    keys = [(r.trace_id, r.metric) for r in rows]
    assert len(keys) == len(set(keys)), "a score was written twice"
    assert all(r.status == "scored" for r in rows), [r for r in rows if r.status != "scored"][:3]
    found = {(r.trace_id, r.metric): r.value for r in rows}
    assert found.keys() == expected.keys()
    wrong = {k: (found[k], v) for k, v in expected.items() if found[k] != pytest.approx(v)}
    assert not wrong, list(wrong.items())[:5]
    assert job_statuses(pg_engine) == {JobStatus.DONE: len(expected)}
    return {"seed": seed, "rounds": rounds, "kills": kills, "done_after_each_round": progress}


def test_sigkilled_workers_leave_exactly_the_expected_scores(
    pg_engine: Any, postgres_url: str, judge_url: str
) -> None:
    result = run_kill_rounds(
        pg_engine, postgres_url, judge_url, rounds=3, traces=400, seed=20261122
    )
    # Some rounds got work done before the kill, so the kills hit a queue in motion.
    assert result["done_after_each_round"][-1] > 0, result


@pytest.mark.slow
def test_many_rounds_of_sigkilled_workers(
    pg_engine: Any, postgres_url: str, judge_url: str
) -> None:
    result = run_kill_rounds(
        pg_engine, postgres_url, judge_url, rounds=25, traces=3000, seed=int(time.time())
    )
    print(f"kill rounds: {result}")
