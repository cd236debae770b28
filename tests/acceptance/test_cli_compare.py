"""``scores compare`` and ``check --compare-to`` as a user runs them, over traces scored by a
real worker: one release detectably worse than the one before, a canary too small to judge,
tags to filter by, and bad input answered in one line."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace
from tests.support.postgres import truncate_all

METRIC = "id_based_context_recall"


def traces(release: str, p: float, count: int, rng: random.Random, start: datetime) -> list:
    """``count`` traces whose id-based recall is k/4, k ~ Binomial(4, p)."""
    made = []
    for index in range(count):
        found = sum(rng.random() < p for _ in range(4))
        expected = [f"doc_{i}" for i in range(found)] + [f"missing_{i}" for i in range(4 - found)]
        record = make_trace(
            contexts=4,
            context_chars=40,
            reference_context_ids=expected,
            started_at=start + timedelta(seconds=index),
        )
        record.release = release
        record.environment = "production"
        record.tags = ["beta"] if index % 2 else []
        made.append(record)
    return made


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        database = f"sqlite:///{tmp_path_factory.mktemp('compare') / 'history.db'}"
        upgrade(database)
    else:
        database = request.getfixturevalue("postgres_url")
        engine = create_engine_from_url(database)
        truncate_all(engine)
        engine.dispose()
    rng = random.Random(11)
    now = datetime.now(timezone.utc)
    repo = make_repository(create_engine_from_url(database), metrics=[METRIC])
    repo.write_traces(traces("2.4.1", 0.75, 400, rng, now - timedelta(days=2)))
    repo.write_traces(traces("2.5.0", 0.6, 400, rng, now - timedelta(days=1)))
    repo.write_traces(traces("2.5.1-canary", 0.3, 5, rng, now - timedelta(hours=1)))
    repo.dispose()
    worker = run("worker", "--once", "--no-progress", "--metric", METRIC, url=database)
    assert worker.returncode == 0, worker.stderr
    assert "scored 805" in worker.stdout
    # Scores keep their trace's release and environment, so comparing them needs no join.
    engine = create_engine_from_url(database)
    with engine.connect() as conn:
        kept = conn.execute(
            text("SELECT release, environment, count(*) FROM scores GROUP BY 1, 2 ORDER BY 1")
        ).all()
    engine.dispose()
    assert [tuple(row) for row in kept] == [
        ("2.4.1", "production", 400),
        ("2.5.0", "production", 400),
        ("2.5.1-canary", "production", 5),
    ]
    yield database


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["COLUMNS"] = "160"
    return run_cli(*args, "--database-url", url, cwd=ROOT, env=env)


def test_compare_by_release_finds_the_worse_release_and_the_small_canary(url: str) -> None:
    done = run("scores", "compare", "--metric", METRIC, "--by", "release", "--format", "json",
               url=url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["metric"] == METRIC and result["by"] == "release"
    assert result["baseline"] == "2.4.1", result  # the release seen first
    groups = {g["group"]: g for g in result["groups"]}
    assert [g["group"] for g in result["groups"]] == ["2.4.1", "2.5.0", "2.5.1-canary"]
    old, new, canary = groups["2.4.1"], groups["2.5.0"], groups["2.5.1-canary"]
    assert old["traces"] == new["traces"] == 400
    assert old["verdict"] == "baseline" and old["ci95"][0] < old["mean"] < old["ci95"][1]
    assert new["verdict"] == "worse"
    assert new["difference_ci95"][1] < 0
    assert new["difference"] == pytest.approx(new["mean"] - old["mean"])
    assert "bootstrap" in new["method"]
    assert canary["traces"] == 5 and canary["verdict"] == "too few traces"
    assert canary["ci95"] is None

    table = run("scores", "compare", "--metric", METRIC, "--by", "release", url=url)
    assert table.returncode == 0, table.stderr
    assert "worse" in table.stdout and "too few traces (< 30)" in table.stdout
    assert "Intervals: percentile bootstrap over traces (1000 resamples)" in table.stdout


def test_filters_baselines_and_tags(url: str) -> None:
    against_new = run(
        "scores", "compare", "--metric", METRIC, "--by", "release", "--baseline", "2.5.0",
        "--where", "tag=beta", "--where", "environment=production", "--format", "json", url=url,
    )  # fmt: skip
    assert against_new.returncode == 0, against_new.stderr
    groups = {g["group"]: g for g in json.loads(against_new.stdout)["groups"]}
    assert groups["2.4.1"]["traces"] == 200  # every other trace is tagged
    assert groups["2.4.1"]["verdict"] == "better"
    by_tag = run("scores", "compare", "--metric", METRIC, "--by", "tag", "--format", "csv",
                 url=url)  # fmt: skip
    assert by_tag.returncode == 0, by_tag.stderr
    header, *rows = by_tag.stdout.strip().splitlines()
    assert header.startswith("group,traces,mean,ci95_low")
    assert {row.split(",")[0] for row in rows} == {"", "beta"}


def test_check_compare_to_fails_a_worse_release(url: str) -> None:
    worse = run("check", "--metric", METRIC, "--where", "release=2.5.0", "--compare-to",
                "release=2.4.1", "--since", "7d", url=url)  # fmt: skip
    assert worse.returncode == 1
    assert worse.stderr.startswith(f"FAIL {METRIC} release=2.5.0: mean ")
    assert "detectably worse" in worse.stderr
    better = run("check", "--metric", METRIC, "--where", "release=2.4.1", "--compare-to",
                 "release=2.5.0", "--since", "7d", url=url)  # fmt: skip
    assert better.returncode == 0, better.stderr
    assert better.stdout.startswith(f"OK {METRIC} release=2.4.1") and "better" in better.stdout
    canary = run("check", "--metric", METRIC, "--where", "release=2.5.1-canary",
                 "--compare-to", "release=2.4.1", "--since", "7d", url=url)  # fmt: skip
    assert canary.returncode == 1
    assert "too few scored traces to compare release=2.5.1-canary (5)" in canary.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scores", "compare", "--metric", METRIC, "--by", "colour"], "unknown attribute 'colour'"),
        (["scores", "compare", "--metric", METRIC, "--by", "release", "--baseline", "9.9"],
         "--baseline '9.9': no scored traces have release=9.9"),
        (["scores", "compare", "--by", "release"],
         "the following arguments are required: --metric"),
        (["scores", "compare", "--metric", METRIC, "--by", "release", "--where", "release"],
         "expected ATTRIBUTE=VALUE"),
        (["check", "--metric", METRIC], "check needs --min X, --compare-to ATTR=VALUE, or both"),
        (["check", "--metric", METRIC, "--compare-to", "release=2.4.1"],
         "add --where release=VALUE"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(url: str, args: list[str], message: str) -> None:
    done = run(*args, url=url)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in done.stderr


def test_summary_worst_and_plot_filter_by_attribute(
    url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    every = run("scores", "summary", "--metric", METRIC, "--format", "json", url=url)
    beta = run("scores", "summary", "--metric", METRIC, "--where", "tag=beta",
               "--where", "release=2.5.0", "--format", "json", url=url)  # fmt: skip
    assert every.returncode == 0 and beta.returncode == 0, beta.stderr
    assert sum(r["count"] for r in json.loads(every.stdout)) == 805
    assert sum(r["count"] for r in json.loads(beta.stdout)) == 200
    worst = run("scores", "worst", "--metric", METRIC, "--where", "release=2.4.1", "--limit",
                "500", "--format", "json", url=url)  # fmt: skip
    assert worst.returncode == 0, worst.stderr
    rows = json.loads(worst.stdout)
    assert len(rows) == 400
    out = tmp_path_factory.mktemp("plot") / "beta.svg"
    plot = run("scores", "plot", "--out", str(out), "--where", "environment=production", url=url)
    assert plot.returncode == 0, plot.stderr
    assert "<svg" in out.read_text()


def test_worst_per_question_gives_each_question_one_row(url: str) -> None:
    plain = run("scores", "worst", "--metric", METRIC, "--limit", "5", "--format", "json", url=url)
    assert plain.returncode == 0, plain.stderr
    assert len(json.loads(plain.stdout)) == 5  # the same question five times
    grouped = run("scores", "worst", "--metric", METRIC, "--limit", "5", "--per-question",
                  "--format", "json", url=url)  # fmt: skip
    assert grouped.returncode == 0, grouped.stderr
    (row,) = json.loads(grouped.stdout)
    assert row["question"] == "What is the capital of France?"
    assert row["traces_with_question"] == 805
    assert row["value"] == json.loads(plain.stdout)[0]["value"]
    table = run("scores", "worst", "--metric", METRIC, "--per-question", url=url)
    assert "(805 traces)" in table.stdout
    csv_out = run("scores", "worst", "--metric", METRIC, "--per-question", "--format", "csv",
                  url=url)  # fmt: skip
    assert csv_out.stdout.splitlines()[0].endswith("question,traces_with_question")


def test_labels_correct_the_comparison_and_the_check(url: str, tmp_path: Path) -> None:
    """People label 60 traces of each release: on 2.5.0 they find recall a fifth higher than
    the variant says (on 2.4.1 they agree with it). Corrected by the labels (prediction-powered
    inference), 2.5.0 is no longer detectably worse, and the output says it was corrected."""
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        picked = {
            release: conn.execute(
                text(
                    "SELECT trace_id, value FROM scores WHERE release = :r AND status = 'scored' "
                    "ORDER BY trace_id LIMIT 60"
                ),
                {"r": release},
            ).all()
            for release in ("2.4.1", "2.5.0")
        }
    labels = tmp_path / "labels.csv"
    rows = ["trace_id,metric,value"]
    for release, shift in (("2.4.1", 0.0), ("2.5.0", 0.2)):
        rows += [
            f"{trace_id},{METRIC},{min(1.0, value + shift)}" for trace_id, value in picked[release]
        ]
    labels.write_text("\n".join(rows) + "\n")
    try:
        done = run("labels", "import", str(labels), "--labeller", "qa", url=url)
        assert done.returncode == 0, done.stderr
        compared = run("scores", "compare", "--metric", METRIC, "--by", "release",
                       "--format", "json", url=url)  # fmt: skip
        assert compared.returncode == 0, compared.stderr
        groups = {g["group"]: g for g in json.loads(compared.stdout)["groups"]}
        old, new, canary = groups["2.4.1"], groups["2.5.0"], groups["2.5.1-canary"]
        assert (old["labels"], new["labels"], canary["labels"]) == (60, 60, 0)
        assert old["corrected"] and new["corrected"] and not canary["corrected"]
        assert new["mean"] > new["judge_mean"] + 0.1
        assert new["verdict"] != "worse" and "prediction-powered" in new["difference_method"]

        table = run("scores", "compare", "--metric", METRIC, "--by", "release", url=url)
        assert "* corrected by people's labels (prediction-powered inference)" in table.stdout
        fewer = run("scores", "compare", "--metric", METRIC, "--by", "release",
                    "--min-labels", "61", url=url)  # fmt: skip
        assert "too few labelled traces to correct (at least 61 needed)" in fewer.stdout
        assert "worse" in fewer.stdout

        check = run("check", "--metric", METRIC, "--where", "release=2.5.0", "--compare-to",
                    "release=2.4.1", "--since", "7d", url=url)  # fmt: skip
        assert check.returncode == 0, check.stderr
        assert "corrected by 60 and 60 labelled traces" in check.stdout
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM labels"))
        engine.dispose()


def test_summary_by_release_and_tag_splits_each_bucket(url: str) -> None:
    by_release = run("scores", "summary", "--metric", METRIC, "--by", "release", "--format",
                     "json", url=url)  # fmt: skip
    assert by_release.returncode == 0, by_release.stderr
    rows = json.loads(by_release.stdout)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["release"]] = counts.get(row["release"], 0) + row["count"]
    assert counts == {"2.4.1": 400, "2.5.0": 400, "2.5.1-canary": 5}
    # Each group's rows are the summary filtered by it.
    filtered = run("scores", "summary", "--metric", METRIC, "--where", "release=2.5.0",
                   "--format", "json", url=url)  # fmt: skip
    assert [
        {k: v for k, v in r.items() if k != "release"} for r in rows if r["release"] == "2.5.0"
    ] == json.loads(filtered.stdout)

    by_tag = run("scores", "summary", "--metric", METRIC, "--by", "tag", "--format", "csv",
                 url=url)  # fmt: skip
    assert by_tag.returncode == 0, by_tag.stderr
    lines = by_tag.stdout.splitlines()
    assert lines[0].startswith("bucket_start,tag,metric,")
    tags = {line.split(",")[1] for line in lines[1:]}
    assert tags == {"beta", ""}  # the traces without a tag: an empty cell
    table = run("scores", "summary", "--metric", METRIC, "--by", "tag", url=url)
    assert table.returncode == 0, table.stderr
    assert "(none)" in table.stdout and "beta" in table.stdout
    bad = run("scores", "summary", "--by", "colour", url=url)
    assert bad.returncode == 2 and "colour" in bad.stderr and "Traceback" not in bad.stderr


def test_plot_by_release_draws_a_line_per_release(url: str, tmp_path: Path) -> None:
    page = tmp_path / "releases.html"
    done = run("scores", "plot", "--metric", METRIC, "--by", "release", "--out", str(page),
               url=url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = page.read_text()
    for release in ("2.4.1", "2.5.0", "2.5.1-canary"):
        assert f"{METRIC} {release} v" in document  # a legend entry per release
    assert "<th>release</th>" in document
    data = json.loads(
        document.split('id="recalltrace-data">')[1].split("</script>")[0].replace("<\\/", "</")
    )
    assert {row["release"] for row in data["rows"]} == {"2.4.1", "2.5.0", "2.5.1-canary"}
    assert {row["metric"] for row in data["rows"]} == {METRIC}


def test_summary_by_an_attribute_with_too_many_values_says_so(url: str) -> None:
    """Every trace has its own user: one group each is more than a table can show."""
    done = run("scores", "summary", "--by", "user_id", url=url)
    # The fixture's traces carry no user id: one group, (none).
    assert done.returncode == 0 and "(none)" in done.stdout, done.stderr
    engine = create_engine_from_url(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE traces SET user_id = 'user-' || trace_id"))
        many = run("scores", "summary", "--by", "user_id", url=url)
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE traces SET user_id = NULL"))
        engine.dispose()
    assert many.returncode == 2, many.stdout
    assert "more than 50 values of user_id in the window" in many.stderr
    assert "Traceback" not in many.stderr
