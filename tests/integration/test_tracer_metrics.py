"""``configure(metrics=...)`` chooses the variants whose jobs a stored record gets, from the
writer thread and from a storage process alike; an unknown key is refused by ``configure`` in one
line; and the demo without a judge leaves no job that nothing could ever run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from recalltrace.storage.db import create_engine_from_url
from tests.support import ROOT

PROGRAM = """
import sys
import recalltrace

url, separate = sys.argv[1], sys.argv[2] == "process"
recalltrace.configure(
    database_url=url, sample_rate=1.0, storage_process=separate,
    metrics=["id_based_context_recall", "chunk_context_recall"],
)

@recalltrace.rag("metrics-app", reference_context_ids_param="ids")
def answer(question, ids=None):
    return "ok"

for index in range(3):
    answer(f"question {index}", ids=["kb-1"])
assert recalltrace.flush(60)
recalltrace.shutdown(60)
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
    )


def _jobs(url: str) -> dict[str, int]:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT metric, count(*) FROM scoring_jobs GROUP BY metric")
            ).all()
    finally:
        engine.dispose()
    return {metric: count for metric, count in rows}


@pytest.mark.parametrize("where", ["thread", "process"])
def test_only_the_configured_variants_get_jobs(
    database_url: str, tmp_path: Path, where: str
) -> None:
    done = _run("-c", PROGRAM, database_url, where, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _jobs(database_url) == {"id_based_context_recall": 3, "chunk_context_recall": 3}


def test_an_unknown_variant_is_refused_by_configure(tmp_path: Path) -> None:
    program = (
        "import recalltrace\n"
        "try:\n"
        "    recalltrace.configure(database_url='sqlite:///x.db', metrics=['id_based_recall'])\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    done = _run("-c", program, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "unknown metric 'id_based_recall'" in line and "id_based_context_recall" in line
    assert "\n" not in line
    refused = _run(
        "-c", "import recalltrace; recalltrace.configure(metrics='id_based_context_recall')",
        cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "not the string" in refused.stderr.strip().splitlines()[-1]


def test_the_demo_without_a_judge_leaves_no_job_waiting(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "recalltrace", "demo"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    url = f"sqlite:///{tmp_path / 'recalltrace.db'}"
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            pending = conn.execute(
                text(
                    "SELECT metric, status, count(*) FROM scoring_jobs "
                    "WHERE status NOT IN ('done', 'skipped') GROUP BY metric, status"
                )
            ).all()
            metrics = {row[0] for row in conn.execute(text("SELECT metric FROM scoring_jobs"))}
    finally:
        engine.dispose()
    assert pending == []
    assert metrics == {"non_llm_context_recall", "id_based_context_recall"}
