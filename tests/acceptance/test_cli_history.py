"""The history commands as a user runs them: the ``recalltrace`` command line (in process, with
its own environment, stdout and stderr), on a SQLite file and on Postgres, over data stored the
way a worker stores it."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import statistics
import subprocess
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from recalltrace.scorers.catalog import CATALOG
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.records import TraceRecord
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace
from tests.support.postgres import admin_engine, base_url, truncate_all

METRICS = (
    "llm_context_recall",
    "id_based_context_recall",
    "chunk_context_recall",
    "context_entity_recall",
)

CLAIMS = [
    {
        "statement": "Paris is the capital of France.",
        "reason": "Context 0 says so.",
        "attributed": 1,
    },
    {
        "statement": "Paris hosts the Louvre museum.",
        "reason": "No context mentions it.",
        "attributed": 0,
    },
]
CHUNKS = {
    "evaluated_chunks": [
        {"id_chunk": 0, "is_relevant": True, "is_included": True, "missing_info": None},
        {
            "id_chunk": 1,
            "is_relevant": True,
            "is_included": False,
            "missing_info": "the population of Paris",
        },
    ],
    "missing_information": [{"chunk_id": 1, "missing_info": "the population of Paris"}],
}
ENTITIES = {
    "reference_entities": ["Paris", "France", "Louvre"],
    "context_entities": ["Paris", "France"],
    "found_entities": ["Paris", "France"],
    "missing_entities": ["Louvre"],
}


@dataclass(frozen=True)
class Result:
    metric: str
    value: float | None
    status: str = "scored"
    reason: str = "Scored from the stored evidence."
    details: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = "judge-model"
    prompt_tokens: int | None = 1200
    completion_tokens: int | None = 80
    cost_usd: float | None = 0.0003
    latency_ms: float | None = 900.0
    version: str = ""  # the metric's current version

    def __post_init__(self) -> None:
        if not self.version:
            object.__setattr__(self, "version", CATALOG[self.metric].version)


@dataclass
class Seeded:
    """A database holding a known history."""

    url: str
    backend: str
    now: datetime
    plan: list[tuple[TraceRecord, list[Result]]]

    def trace(self, index: int) -> TraceRecord:
        return self.plan[index][0]

    @property
    def last_day(self) -> str:
        """The UTC day of the newest trace (not of ``now``: just after midnight they differ)."""
        return max(t.started_at for t, _ in self.plan).strftime("%Y-%m-%d")

    def values(self, metric: str, *, since: datetime, app: str | None = None) -> list[float]:
        return [
            r.value
            for t, results in self.plan
            for r in results
            if r.metric == metric
            and r.value is not None
            and t.started_at >= since
            and (app is None or t.app_name == app)
        ]


def _plan(now: datetime) -> list[tuple[TraceRecord, list[Result]]]:
    def trace(hours_ago: float, app: str) -> TraceRecord:
        return make_trace(
            started_at=now - timedelta(hours=hours_ago),
            app_name=app,
            reference_context_ids=["doc_0", "doc_7"],
        )

    def ok(metric: str, value: float, **kwargs: Any) -> Result:
        return Result(metric, value, **kwargs)

    def failed(metric: str) -> Result:
        return Result(metric, None, status="failed", reason="The judge answered nonsense twice.")

    def skipped(metric: str) -> Result:
        return Result(metric, None, status="skipped", reason="Nothing to score here.")

    return [
        (
            trace(0.5, "support-bot"),
            [
                ok("llm_context_recall", 0.9),
                ok("id_based_context_recall", 1.0),
                ok("chunk_context_recall", 0.75),
                ok("context_entity_recall", 1.0),
            ],
        ),
        (
            trace(3, "support-bot"),
            [
                ok(
                    "llm_context_recall",
                    0.5,
                    reason="One of two reference claims is supported.",
                    details={"claims": CLAIMS, "mode": "one_call"},
                ),
                ok(
                    "id_based_context_recall",
                    0.5,
                    details={"found_ids": ["doc_0"], "missing_ids": ["doc_7"]},
                ),
                ok("chunk_context_recall", 0.5, details=CHUNKS),
                ok("context_entity_recall", 2 / 3, details=ENTITIES),
            ],
        ),
        (
            trace(26, "docs-search"),
            [
                ok("llm_context_recall", 0.25, reason="Only a quarter of the claims are backed."),
                ok("id_based_context_recall", 0.0),
                failed("chunk_context_recall"),
                ok("context_entity_recall", 0.25),
            ],
        ),
        (
            trace(27, "docs-search"),
            [
                ok("llm_context_recall", 0.75),
                ok("id_based_context_recall", 1.0),
                skipped("chunk_context_recall"),
                failed("context_entity_recall"),
            ],
        ),
        (
            trace(50, "support-bot"),
            [
                ok("llm_context_recall", 0.1, reason="Almost nothing of the reference was found."),
                ok("id_based_context_recall", 0.5),
                ok("chunk_context_recall", 0.2),
                ok("context_entity_recall", 0.4),
            ],
        ),
        # Outside the default window of seven days.
        (trace(24 * 10, "support-bot"), [ok("llm_context_recall", 0.0)]),
    ]


def _seed(url: str, now: datetime) -> list[tuple[TraceRecord, list[Result]]]:
    plan = _plan(now)
    engine = create_engine_from_url(url)
    try:
        truncate_all(engine)
        repo = make_repository(engine, metrics=METRICS)
        repo.write_traces([t for t, _ in plan])
        wanted = {(t.trace_id, r.metric): r for t, results in plan for r in results}
        jobs = repo.claim_jobs("seed", limit=1000, lease=timedelta(minutes=5))
        unplanned = []
        for job in jobs:
            result = wanted.pop((job.trace_id, job.metric), None)
            if result is None:
                unplanned.append(job.id)
            else:
                repo.finish_job(job, result)
        repo.release_jobs("seed", unplanned)
        assert not wanted
    finally:
        engine.dispose()
    return plan


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def seeded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'history.db'}"
        upgrade(url)
    else:
        url = str(request.getfixturevalue("postgres_url"))
    now = datetime.now(timezone.utc)
    return Seeded(url=url, backend=request.param, now=now, plan=_seed(url, now))


def run(*args: str, url: str | None = None, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """Run ``recalltrace`` with ``args`` (plus ``--database-url url``) as if in a terminal
    ``columns`` wide."""
    env = {k: v for k, v in os.environ.items() if k != "RECALLTRACE_DATABASE_URL"}
    env["COLUMNS"] = str(columns)
    return run_cli(*args, *(["--database-url", url] if url else []), env=env)


def run_all(*commands: tuple[str, ...], url: str | None) -> list[subprocess.CompletedProcess[str]]:
    """Run independent read-only commands one after the other."""
    return [run(*args, url=url) for args in commands]


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("recalltrace: error: ")
    return lines[0]


def expected_stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if len(ordered) == 1:
        p10 = p50 = p90 = ordered[0]
    else:
        # An independent check of percentile_cont's linear interpolation.
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        p10, p50, p90 = deciles[0], deciles[4], deciles[8]
    return {"mean": statistics.fmean(ordered), "p10": p10, "p50": p50, "p90": p90}


# -- scores summary ------------------------------------------------------------------------------


def test_summary_json_csv_and_table_agree_with_the_stored_scores(seeded: Seeded) -> None:
    as_json, as_csv, as_table = run_all(
        ("scores", "summary", "--format", "json"),
        ("scores", "summary", "--format", "csv"),
        ("scores", "summary"),
        url=seeded.url,
    )
    rows = json.loads(ok(as_json))
    week = seeded.now - timedelta(days=7)

    expected: dict[tuple[str, str], dict[str, Any]] = {}
    for trace, results in seeded.plan:
        if trace.started_at < week:
            continue
        day = trace.started_at.strftime("%Y-%m-%dT00:00:00+00:00")
        for r in results:
            entry = expected.setdefault((day, r.metric), {"values": [], "skipped": 0, "failed": 0})
            if r.value is not None:
                entry["values"].append(r.value)
            else:
                entry[r.status] += 1
    assert sorted((r["bucket_start"], r["metric"]) for r in rows) == sorted(expected)
    for row in rows:
        want = expected[(row["bucket_start"], row["metric"])]
        assert row["count"] == len(want["values"])
        assert (row["skipped"], row["failed"]) == (want["skipped"], want["failed"])
        if want["values"]:
            for key, value in expected_stats(want["values"]).items():
                assert row[key] == pytest.approx(value), (row, key)
        else:
            assert row["mean"] is None and row["p50"] is None

    parsed = list(csv.DictReader(io.StringIO(ok(as_csv))))
    assert len(parsed) == len(rows)
    for line, row in zip(parsed, rows, strict=True):
        assert set(line) == set(row)
        assert line["bucket_start"] == row["bucket_start"]
        assert int(line["count"]) == row["count"]
        assert int(line["failed"]) == row["failed"]
        if row["mean"] is None:
            assert line["mean"] == ""
        else:
            assert float(line["mean"]) == pytest.approx(row["mean"])

    table = ok(as_table)
    for heading in ("count", "mean", "p10", "p50", "p90", "skipped", "failed"):
        assert heading in table
    assert "context_entity_recall" in table
    assert seeded.last_day in table


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_tables_fit_the_terminal_without_cropping(seeded: Seeded, columns: int) -> None:
    """On any common terminal width, nothing is cut off: no line is wider than the terminal,
    every metric name and reason is there in full, and no table loses its right border."""
    summary = ok(run("scores", "summary", url=seeded.url, columns=columns))
    worst = ok(run("scores", "worst", "--limit", "50", url=seeded.url, columns=columns))
    for output in (summary, worst):
        lines = output.splitlines()
        assert max(len(line) for line in lines) <= columns
        for line in lines:
            if line.startswith(("┏", "┃", "┡", "│", "├", "└")):
                assert line.rstrip()[-1] in "┓┃┩│┤┘", line
    for metric in ("llm_context_recall", "context_entity_recall", "id_based_context_recall"):
        assert metric in summary
    listed = ("scores", "worst", "--limit", "50", "--format", "json")
    rows = json.loads(ok(run(*listed, url=seeded.url)))
    assert len(rows) > 3
    assert _reasons_shown(worst) == [" ".join(r["reason"].split()) for r in rows]


def _reasons_shown(output: str) -> list[str]:
    """The reasons as ``scores worst`` printed them, each joined back into one line: from the
    last column of a table, or from the lines under each row's header in the narrow layout."""
    lines = output.splitlines()[1:]  # after the title
    groups: list[list[str]] = [[]]
    if lines[0].startswith("┏"):
        for line in lines[3:]:
            if line.startswith(("├", "└")):
                groups.append([])
            else:
                groups[-1].append(line.split("│")[-2].strip())
    else:
        for line in lines:
            if line.strip():
                groups[-1].append(line.strip())
            else:
                groups.append([])
        groups = [group[2:] for group in groups]  # below the metric and the trace lines
    return [" ".join(" ".join(group).split()) for group in groups if group]


def test_summary_filters_by_metric_app_and_hour(seeded: Seeded) -> None:
    since = (seeded.now - timedelta(days=2, hours=12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (result,) = run_all(
        (
            "scores",
            "summary",
            "--bucket",
            "hour",
            "--metric",
            "llm_context_recall",
            "--app",
            "support-bot",
            "--since",
            since,
            "--format",
            "json",
        ),
        url=seeded.url,
    )
    rows = json.loads(ok(result))
    assert {r["metric"] for r in rows} == {"llm_context_recall"}
    assert sorted(r["mean"] for r in rows) == sorted(
        seeded.values(
            "llm_context_recall", since=seeded.now - timedelta(days=2, hours=12), app="support-bot"
        )
    )
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:00:00\+00:00", r["bucket_start"]) for r in rows)


# -- scores worst ------------------------------------------------------------------------------


def test_worst_lists_the_lowest_traces_with_reasons(seeded: Seeded) -> None:
    as_json, as_table = run_all(
        ("scores", "worst", "--metric", "llm_context_recall", "--limit", "2", "--format", "json"),
        ("scores", "worst", "--metric", "llm_context_recall", "--limit", "3"),
        url=seeded.url,
    )
    rows = json.loads(ok(as_json))
    week_values = sorted(seeded.values("llm_context_recall", since=seeded.now - timedelta(7)))
    assert [r["value"] for r in rows] == week_values[:2] == [0.1, 0.25]
    assert rows[0]["trace_id"] == seeded.trace(4).trace_id
    assert rows[0]["reason"] == "Almost nothing of the reference was found."
    table = ok(as_table)
    assert seeded.trace(4).trace_id in table
    assert "Only a quarter of the claims are backed." in table
    assert seeded.trace(5).trace_id not in table  # older than the default week


# -- trace show ----------------------------------------------------------------------------------


def test_trace_show_renders_inputs_scores_and_evidence(seeded: Seeded) -> None:
    trace = seeded.trace(1)
    as_table, as_json = run_all(
        ("trace", "show", trace.trace_id),
        ("trace", "show", trace.trace_id, "--format", "json"),
        url=seeded.url,
    )
    table = ok(as_table)
    for expected in (
        trace.user_input,
        trace.response,
        trace.reference,
        trace.retrieved_contexts[0].content[:40],
        "doc_2",
        # llm_context_recall: claims with verdicts
        "Paris hosts the Louvre museum.",
        "No context mentions it.",
        "One of two reference claims is supported.",
        # id_based_context_recall: missing reference ids
        "missing ids",
        "doc_7",
        # chunk_context_recall: missing information per chunk
        "the population of Paris",
        "missing information",
        # context_entity_recall: entity sets
        "missing entities",
        "Louvre",
        "judge-model",
    ):
        assert expected is not None and expected in table, expected
    assert re.search(r"attributed", table) and re.search(r"\bno\b", table)

    document = json.loads(ok(as_json))
    assert document["trace_id"] == trace.trace_id
    assert [c["content"] for c in document["contexts"]] == [
        c.content for c in trace.retrieved_contexts
    ]
    details = {s["metric"]: s["details"] for s in document["scores"]}
    assert details["llm_context_recall"]["claims"] == CLAIMS
    assert details["chunk_context_recall"] == CHUNKS
    assert details["context_entity_recall"] == ENTITIES
    assert details["id_based_context_recall"]["missing_ids"] == ["doc_7"]


# -- scores plot -----------------------------------------------------------------------------------


def test_plot_writes_a_self_contained_html_page_with_the_data(
    seeded: Seeded, tmp_path: Path
) -> None:
    out = tmp_path / "recall.html"
    page_result, summary_result = run_all(
        ("scores", "plot", "--out", str(out)),
        ("scores", "summary", "--format", "json"),
        url=seeded.url,
    )
    ok(page_result)
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and "</html>" in page
    # Self-contained: nothing is fetched from elsewhere.
    assert not re.search(r"""(src|href)\s*=|@import|url\(""", page)
    embedded = re.search(
        r'<script type="application/json" id="recalltrace-data">(.*?)</script>', page, re.S
    )
    assert embedded is not None
    data = json.loads(embedded.group(1))
    assert data["rows"] == json.loads(ok(summary_result))
    # The number of scored results per bucket is drawn (and listed in the table).
    day = seeded.last_day
    today = sum(r["count"] for r in data["rows"] if r["bucket_start"].startswith(day))
    assert today > 0
    assert f">{today}</text>" in page
    # Each series is named with the version it was read at, in the legend and in the table.
    for metric in {r["metric"] for r in data["rows"]}:
        version = CATALOG[metric].version
        assert f">{metric} v{version}</text>" in page
        assert f"<td>{metric}</td><td>{version}</td>" in page


def test_plot_svg_is_valid_and_png_is_refused(seeded: Seeded, tmp_path: Path) -> None:
    if seeded.backend != "sqlite":
        pytest.skip("file formats do not depend on the backend")
    svg, png = run_all(
        ("scores", "plot", "--out", str(tmp_path / "recall.svg"), "--bucket", "hour"),
        ("scores", "plot", "--out", str(tmp_path / "recall.png")),
        url=seeded.url,
    )
    ok(svg)
    root = ET.parse(tmp_path / "recall.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall(".//{http://www.w3.org/2000/svg}circle")) >= 8
    message = one_line_error(png)
    assert "PNG" in message and ".html" in message
    assert not (tmp_path / "recall.png").exists()


# -- check -----------------------------------------------------------------------------------------


def test_check_exit_codes(seeded: Seeded) -> None:
    mean = statistics.fmean(
        seeded.values("llm_context_recall", since=seeded.now - timedelta(days=2))
    )
    check = ("check", "--metric", "llm_context_recall", "--since", "2d")
    passing, failing, too_few, empty = run_all(
        (*check, "--min", f"{mean - 0.01:.4f}"),
        (*check, "--min", f"{mean + 0.01:.4f}"),
        (*check, "--min", "0.1", "--min-count", "5"),
        ("check", "--metric", "llm_context_recall", "--since", "5m", "--min", "0.1"),
        url=seeded.url,
    )
    out = ok(passing)
    assert out.startswith("OK llm_context_recall: mean ") and out.count("\n") == 1
    assert f"{mean:.4f}" in out and "over 4 scored traces" in out

    for result, reason in ((failing, "is below"), (too_few, "fewer than the 5 required")):
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("FAIL llm_context_recall: ") and reason in line
    assert empty.returncode == 1
    assert "0 scored traces" in empty.stderr


def test_metric_version_reads_one_version_of_a_metric(seeded: Seeded) -> None:
    summary = ("scores", "summary", "--since", "2d", "--format", "json")
    metric = ("--metric", "llm_context_recall")
    default, current, old, no_metric, check_old, worst_old = run_all(
        (*summary, *metric),
        (*summary, *metric, "--metric-version", "1"),
        (*summary, *metric, "--metric-version", "0"),
        (*summary, "--metric-version", "1"),
        ("check", *metric, "--metric-version", "0", "--since", "2d", "--min", "0.1"),
        ("scores", "worst", *metric, "--metric-version", "0", "--format", "json"),
        url=seeded.url,
    )
    rows = json.loads(ok(default))
    assert rows and {r["version"] for r in rows} == {"1"}
    assert json.loads(ok(current)) == rows
    assert json.loads(ok(old)) == []
    assert json.loads(ok(worst_old)) == []
    assert no_metric.returncode == 2
    assert "--metric-version needs --metric" in one_line_error(no_metric)
    assert check_old.returncode == 1
    assert "0 scored traces" in check_old.stderr and "version 0" in check_old.stderr
    assert ok(run("--version")).startswith("recalltrace ")  # the program's own, untouched


# -- jobs ------------------------------------------------------------------------------------------


def test_jobs_list_and_retry(seeded: Seeded) -> None:
    listed = json.loads(ok(run("jobs", "list", "--format", "json", url=seeded.url)))
    failed = {(j["trace_id"], j["metric"]): j["id"] for j in listed if j["problem"] == "failed"}
    chunk = (seeded.trace(2).trace_id, "chunk_context_recall")
    entity = (seeded.trace(3).trace_id, "context_entity_recall")
    assert set(failed) == {chunk, entity}  # both traces belong to docs-search
    assert all(j["last_error"] == "The judge answered nonsense twice." for j in listed)

    table, by_id, other_app = run_all(
        ("jobs", "list"),
        ("jobs", "retry", "--id", str(failed[chunk]), "--id", "999999"),
        ("jobs", "retry", "--app", "support-bot"),
        url=seeded.url,
    )
    assert "context_entity_recall" in ok(table)
    # The known failed job is queued again; the unknown id makes the command fail, in one line.
    assert by_id.returncode == 2
    assert by_id.stdout == "queued again: 1 failed job\n"
    assert "not queued again (only failed jobs are): job 999999 does not exist" in one_line_error(
        by_id
    )
    assert ok(other_app) == "queued again: 0 failed jobs\n"
    narrowed = run(
        "jobs", "retry", "--metric", "context_entity_recall", "--app", "docs-search", url=seeded.url
    )
    assert ok(narrowed) == "queued again: 1 failed job\n"
    rest = ok(run("jobs", "retry", url=seeded.url))
    assert rest == "queued again: 0 failed jobs, 0 jobs whose lease had expired\n"
    assert json.loads(ok(run("jobs", "list", "--format", "json", url=seeded.url))) == []


# -- errors ----------------------------------------------------------------------------------------


def test_an_unknown_app_or_version_names_what_exists(seeded: Seeded) -> None:
    typo, json_typo, worst, check, version = run_all(
        ("scores", "summary", "--since", "2d", "--app", "suport-bot"),
        ("scores", "summary", "--since", "2d", "--app", "suport-bot", "--format", "json"),
        ("scores", "worst", "--app", "nobody"),
        ("check", "--metric", "llm_context_recall", "--min", "0.5", "--since", "2d", "--app", "x"),
        ("scores", "summary", "--metric", "llm_context_recall", "--metric-version", "7"),
        url=seeded.url,
    )
    text = " ".join(ok(typo).split())
    assert "no app 'suport-bot' has scores; apps with scores: docs-search, support-bot" in text
    assert "did you mean support-bot?" in text
    # Machine-readable output stays what it was; the hint goes to stderr.
    assert json.loads(ok(json_typo)) == []
    assert "did you mean support-bot?" in json_typo.stderr
    assert "apps with scores: docs-search, support-bot" in " ".join(ok(worst).split())
    assert check.returncode == 1
    assert "no app 'x' has scores" in check.stderr
    assert "has no scores of version '7'; versions: 1" in " ".join(ok(version).split())
    # A filter that exists but matches nothing in the window gets no hint.
    quiet = run(
        "scores",
        "summary",
        "--app",
        "support-bot",
        "--since",
        "2d",
        "--until",
        "1d",
        url=seeded.url,
    )
    assert "Note:" not in ok(quiet)


def test_a_bare_path_as_database_url_shows_the_url_to_write(tmp_path: Path) -> None:
    result = run("scores", "summary", "--database-url", "./recalltrace.db")
    message = one_line_error(result)
    assert message == (
        "recalltrace: error: './recalltrace.db' is not a database URL; for a SQLite file give "
        "sqlite:///./recalltrace.db, for Postgres e.g. postgresql+psycopg://user@host:5432/db"
    )


def test_unknown_trace_id_is_one_line(seeded: Seeded) -> None:
    missing = "f" * 32
    message = one_line_error(run("trace", "show", missing, url=seeded.url))
    assert message == f"recalltrace: error: no trace is stored with id '{missing}'"
    message = one_line_error(run("trace", "show", "not-hex!", url=seeded.url))
    assert "is not a trace id: give the 32 hex digits" in message


def test_trace_show_takes_the_dashed_and_the_short_forms(seeded: Seeded) -> None:
    trace_id = seeded.trace(0).trace_id
    dashed = "-".join(
        (trace_id[:8], trace_id[8:12], trace_id[12:16], trace_id[16:20], trace_id[20:])
    )
    for given in (dashed, dashed.upper(), trace_id[:12]):
        shown = json.loads(ok(run("trace", "show", given, "--format", "json", url=seeded.url)))
        assert shown["trace_id"] == trace_id, given
    message = one_line_error(run("trace", "show", trace_id[:5], url=seeded.url))
    assert "too short: give at least 8 hex digits" in message


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    # Checked before the database is touched, so one backend shows it.
    url = f"sqlite:///{tmp_path / 'args.db'}"
    upgrade(url)
    bad_since, bad_until, bad_metric, bad_check = run_all(
        ("scores", "summary", "--since", "3 fortnights"),
        ("scores", "plot", "--out", str(tmp_path / "x.html"), "--until", "2026-13-01"),
        ("scores", "worst", "--metric", "context_precision"),
        ("check", "--metric", "nope", "--min", "0.5"),
        url=url,
    )
    assert "invalid time '3 fortnights'" in one_line_error(bad_since)
    assert "invalid time '2026-13-01'" in one_line_error(bad_until)
    message = one_line_error(bad_metric)
    assert "unknown metric 'context_precision'" in message and "llm_context_recall" in message
    assert "unknown metric 'nope'" in one_line_error(bad_check)


def test_unmigrated_and_missing_sqlite_databases(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    unmigrated, missing = (
        run("scores", "summary", url=f"sqlite:///{empty}"),
        run("trace", "show", "a" * 32, url=f"sqlite:///{tmp_path / 'typo.db'}"),
    )
    assert "not migrated" in one_line_error(unmigrated)
    assert "no database file" in one_line_error(missing)
    assert not (tmp_path / "typo.db").exists()


@pytest.mark.postgres
def test_unmigrated_postgres_database(postgres_url: str) -> None:
    name = f"rt_hist_empty_{uuid.uuid4().hex[:8]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(base_url()).set(database=name).render_as_string(hide_password=False)
        for result in run_all(
            ("scores", "summary"),
            ("check", "--metric", "llm_context_recall", "--min", "0.5"),
            url=url,
        ):
            assert "not migrated: run `recalltrace db upgrade`" in one_line_error(result)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_unreachable_and_malformed_database_urls() -> None:
    unreachable, malformed = run_all(
        (
            "scores",
            "worst",
            "--database-url",
            "postgresql+psycopg://alice:hunter2-secret@127.0.0.1:1/nowhere",
        ),
        ("jobs", "list", "--database-url", "mysql://bob:pw-xyz@db/x"),
        url=None,
    )
    message = one_line_error(unreachable)
    assert message.startswith("recalltrace: error: cannot reach the database")
    assert "hunter2-secret" not in message
    assert "unsupported database backend" in one_line_error(malformed)
    assert "pw-xyz" not in malformed.stderr


@pytest.fixture(autouse=True)
def _no_stray_default_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The commands default to ./recalltrace.db; run from a scratch folder so none is created.
    monkeypatch.chdir(tmp_path)
    yield


def test_first_hour_papercuts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'papercuts.db'}"
    upgrade(url)
    negative = one_line_error(run("scores", "summary", "--since", "-1h", url=url))
    assert "a duration already counts back from now; use 1h for 1h ago" in negative
    future = one_line_error(run("scores", "summary", "--since", "2099-01-01", url=url))
    assert "is in the future" in future


def test_csv_numbers_are_not_float_noise(seeded: Seeded) -> None:
    from recalltrace.cli._render import _csv_cell

    assert _csv_cell(0.1 + 0.2 - 0.2) == "0.1"
    assert _csv_cell(1 / 3) == "0.333333333333"
    text = ok(run("scores", "summary", "--since", "30d", "--format", "csv", url=seeded.url))
    assert "0000000000" not in text and "9999999999" not in text
