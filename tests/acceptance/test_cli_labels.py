"""Human labels imported from files and measured against the judge's stored scores, checked
against figures worked out by hand (and ``statistics.correlation`` as the reference)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Label
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace

METRIC = "id_based_context_recall"
JUDGE = [1.0, 0.75, 0.5, 0.25, 0.0, 1.0]
PEOPLE = [1.0, 0.5, 0.5, 0.0, 0.25, 0.0]


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["COLUMNS"] = "140"
    return run_cli(*args, "--database-url", url, cwd=ROOT, env=env)


@pytest.fixture
def scored(tmp_path: Path) -> tuple[str, list[str]]:
    url = f"sqlite:///{tmp_path / 'labels.db'}"
    upgrade(url)
    records = []
    for value in JUDGE:
        found = round(value * 4)
        expected = [f"doc_{i}" for i in range(found)] + [f"gone_{i}" for i in range(4 - found)]
        records.append(make_trace(contexts=4, reference_context_ids=expected))
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    repo.write_traces(records)
    repo.dispose()
    worker = run("worker", "--once", "--no-progress", "--metric", METRIC, url=url)
    assert worker.returncode == 0, worker.stderr
    return url, [r.trace_id for r in records]


def labels_stored(url: str) -> int:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        count = int(conn.execute(select(func.count()).select_from(Label)).scalar_one())
    engine.dispose()
    return count


def test_agreement_matches_the_hand_computed_figures(
    scored: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = scored
    csv_file = tmp_path / "labels.csv"
    rows = ["trace_id,metric,value,note"]
    rows += [f"{i},{METRIC},{v},note {n}" for n, (i, v) in enumerate(zip(ids, PEOPLE, strict=True))]
    csv_file.write_text("\n".join(rows) + "\n")
    done = run("labels", "import", str(csv_file), "--labeller", "ana", url=url)
    assert done.returncode == 0, done.stderr
    assert "imported 6 label(s) by ana" in done.stdout

    report = run("scores", "agreement", "--metric", METRIC, "--format", "json", url=url)
    assert report.returncode == 0, report.stderr
    (figures,) = json.loads(report.stdout)["reports"]
    assert figures["labelled"] == 6 and figures["model"] is None
    assert figures["mae"] == pytest.approx(1.75 / 6)
    assert figures["pearson"] == pytest.approx(statistics.correlation(JUDGE, PEOPLE))
    # Ranks by hand, ties sharing their mean rank.
    judge_ranks = [5.5, 4, 3, 2, 1, 5.5]
    people_ranks = [6, 4.5, 4.5, 1.5, 3, 1.5]
    assert figures["spearman"] == pytest.approx(statistics.correlation(judge_ranks, people_ranks))
    # At 0.5: the judge passes 4 (one the person failed), the person passes 3.
    assert figures["confusion"] == {
        "judge_pass_label_pass": 3,
        "judge_pass_label_fail": 1,
        "judge_fail_label_pass": 0,
        "judge_fail_label_fail": 2,
    }
    assert figures["kappa"] == pytest.approx(2 / 3)
    worst = figures["worst"][0]
    assert (worst["trace_id"], worst["score"], worst["label"]) == (ids[5], 1.0, 0.0)
    assert worst["note"] == "note 5" and worst["reason"]

    table = run("scores", "agreement", "--metric", METRIC, url=url)
    assert "Cohen's kappa at 0.5" in table.stdout and "0.667" in table.stdout

    # The same labeller again replaces; JSON Lines carry per-claim verdicts.
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(
        json.dumps({"trace_id": ids[0], "value": 0.0, "claims": [{"claim": "x", "ok": False}]})
        + "\n"
    )
    again = run("labels", "import", str(jsonl), "--labeller", "ana", "--metric", METRIC, url=url)
    assert again.returncode == 0, again.stderr
    assert labels_stored(url) == 6


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("trace_id,metric,value\n{0},{m},0.5\n{0},{m},1.5\n", ".csv",
         "line 3: value 1.5 is outside [0, 1]; nothing was imported"),
        ("trace_id,metric,value\n{0},{m},high\n", ".csv", "line 2: value 'high' is not a number"),
        ("trace_id,metric,value\nffffffffffffffffffffffffffffffff,{m},0.5\n", ".csv",
         "no trace is stored with id 'ffffffffffffffffffffffffffffffff'"),
        ('{{"trace_id": "{0}", "value": 0.5}}\n', ".jsonl", "no metric (add a metric column"),
        ('{{"trace_id": "{0}", "metric": "{m}", "value": 0.5\n', ".jsonl", "line 1: not JSON"),
        ("id,score\n1,2\n", ".csv", "expected a CSV header row with trace_id"),
    ],
)  # fmt: skip
def test_bad_files_import_nothing_and_say_why_in_one_line(
    scored: tuple[str, list[str]], tmp_path: Path, content: str, suffix: str, message: str
) -> None:
    url, ids = scored
    path = tmp_path / f"bad{suffix}"
    path.write_text(content.format(ids[0], m=METRIC))
    done = run("labels", "import", str(path), "--labeller", "ana", url=url)
    assert done.returncode == 2, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert message in line
    assert labels_stored(url) == 0


def test_labelled_traces_rescored_by_another_judge_beside_the_stored_one(tmp_path: Path) -> None:
    """Compare judges before switching: the candidate scores the labelled traces now, nothing
    is stored, and what it could not score is counted with its reason."""
    from tests.support.judge_server import JudgeServer, Reply

    metric = "judge_context_recall"
    url = f"sqlite:///{tmp_path / 'rescore.db'}"
    upgrade(url)
    records = [make_trace() for _ in range(5)]
    repo = make_repository(create_engine_from_url(url), metrics=[metric])
    repo.write_traces(records)
    repo.dispose()
    ids = sorted(r.trace_id for r in records)
    people = [1.0, 0.5, 0.0, 1.0, 0.5]
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(
        "trace_id,metric,value\n"
        + "".join(f"{i},{metric},{v}\n" for i, v in zip(ids, people, strict=True))
    )
    with JudgeServer() as judge:
        stored = run(
            "worker", "--once", "--no-progress", "--metric", metric, "--judge-model",
            "openai/gpt-4o-mini", "--judge-api-base", judge.base_url, url=url,
        )  # fmt: skip
        assert stored.returncode == 0, stored.stderr
        assert run("labels", "import", str(csv_file), "--labeller", "ana", url=url).returncode == 0
        calls_before = judge.call_count
        candidate = [1.0, 0.5, 0.25, None, 0.5]  # in trace id order; None: the call is refused
        judge.script(
            *(
                Reply.error(400, "this request is refused")
                if value is None
                else Reply.json({"context_recall_score": value, "reason": "by the candidate"})
                for value in candidate
            )
        )
        report = run(
            "scores", "agreement", "--metric", metric, "--judge-model", "openai/gpt-4.1-mini",
            "--judge-api-base", judge.base_url, "--judge-max-retries", "0", "--concurrency", "1",
            "--format", "json", url=url,
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        assert judge.call_count - calls_before == 5, report.stdout
        table = run(
            "scores", "agreement", "--metric", metric, "--judge-model", "openai/gpt-4.1-mini",
            "--judge-api-base", judge.base_url, "--concurrency", "1", url=url,
        )  # fmt: skip
    document = json.loads(report.stdout)
    by_kind = {r["rescored"]: r for r in document["reports"]}
    assert by_kind[False]["model"] == "openai/gpt-4o-mini" and by_kind[False]["labelled"] == 5
    assert by_kind[False]["mae"] == pytest.approx(statistics.fmean(abs(0.8 - p) for p in people))
    fresh = by_kind[True]
    assert fresh["model"] == "openai/gpt-4.1-mini" and fresh["labelled"] == 4
    kept = [(c, p) for c, p in zip(candidate, people, strict=True) if c is not None]
    assert fresh["mae"] == pytest.approx(statistics.fmean(abs(c - p) for c, p in kept))
    assert fresh["pearson"] == pytest.approx(
        statistics.correlation([c for c, _ in kept], [p for _, p in kept])
    )
    rescoring = document["rescoring"]
    assert (rescoring["labelled_traces"], rescoring["scored"]) == (5, 4)
    ((reason, count),) = rescoring["not_scored"].items()
    assert count == 1 and reason.startswith("failed") and "this request is refused" in reason
    assert rescoring["prompt_tokens"] > 0
    # Nothing of the candidate's was stored.
    assert labels_stored(url) == 5
    again = run("scores", "agreement", "--metric", metric, "--format", "json", url=url)
    assert [r["model"] for r in json.loads(again.stdout)["reports"]] == ["openai/gpt-4o-mini"]
    assert table.returncode == 0, table.stderr
    assert "re-scored now (not stored)" in table.stdout
    assert "Re-scored 5 of 5 labelled traces with openai/gpt-4.1-mini" in table.stdout


def test_rescoring_a_variant_without_a_judge_says_so(scored: tuple[str, list[str]]) -> None:
    url, _ids = scored
    done = run(
        "scores", "agreement", "--metric", METRIC, "--judge-model", "openai/x", url=url
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "id_based_context_recall does not use a judge: --judge-model re-scores an LLM variant "
        "(llm_context_recall, chunk_context_recall, judge_context_recall...)"
    )
    assert "Traceback" not in done.stderr
