"""``recalltrace scores diagnose`` as a user runs it: the planted causes named first in every
format, each row's drill-down command run and showing the traces it promises, ``trace show``
marking each reference document's rank, and bad input answered in one line."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

import pytest

from recalltrace.cli import main
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.diagnose_data import ID_METRIC, LLM_METRIC, WARRANTY, score_all, traffic
from tests.support.factories import make_repository
from tests.support.postgres import truncate_all


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        database = f"sqlite:///{tmp_path_factory.mktemp('diagnose') / 'history.db'}"
        upgrade(database)
    else:
        database = request.getfixturevalue("postgres_url")
    engine = create_engine_from_url(database)
    if request.param == "postgres":
        truncate_all(engine)
    repo = make_repository(engine, metrics=[ID_METRIC, LLM_METRIC])
    rng = random.Random(7)
    score_all(repo, traffic(rng, 900, app="help-desk", planted=True), rng, planted=True)
    engine.dispose()
    yield database


def run(*args: str, columns: int = 200) -> tuple[int, str, str]:
    """The command line in this process, its output captured, as wide as a terminal of
    ``columns`` (whatever an earlier test left in the environment)."""
    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse refuses a bad value by exiting
            code = int(stop.code or 0)
        finally:
            if saved is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = saved
    return code, out.getvalue(), err.getvalue()


def diagnose(url: str, *args: str) -> str:
    code, out, err = run("scores", "diagnose", "--database-url", url, *args)
    assert code == 0, err
    return out


def test_json_names_the_planted_causes_first_with_their_drill_down(url: str) -> None:
    document = json.loads(diagnose(url, "--metric", ID_METRIC, "--since", "1d", "--format", "json"))
    assert document["scored"] == 900 and document["q"] == 0.05
    slices = [(s["attribute"], s["value"]) for s in document["slices"]]
    assert set(slices) == {("tag", "legacy"), ("document.index", "v1-stale")}, slices
    missed = document["missed_references"]
    assert missed[0]["reference"] == "kb-never" and missed[0]["retrieved"] == 0
    assert "kb-always" not in [m["reference"] for m in missed]
    assert document["attributes_skipped"]["user_id"] > 50
    for row in document["slices"]:
        if row["attribute"] == "tag":
            assert row["drill"].startswith("recalltrace scores worst --metric " + ID_METRIC)
            assert "--where tag=legacy" in row["drill"]
        else:
            assert row["drill"].startswith("recalltrace trace show ")
    assert missed[0]["drill"] == (
        f"recalltrace trace show {missed[0]['example_trace_ids'][0]} --database-url "
        + shlex.quote(url)
    )


def test_every_drill_down_runs_and_shows_the_traces_it_names(url: str) -> None:
    document = json.loads(diagnose(url, "--metric", ID_METRIC, "--format", "json"))
    legacy = next(s for s in document["slices"] if s["attribute"] == "tag")
    words = shlex.split(legacy["drill"])[1:]
    code, out, err = run(*words, "--format", "json", "--limit", "20")
    assert code == 0, err
    worst = json.loads(out)
    assert len(worst) == 20 and all(r["metric"] == ID_METRIC for r in worst)
    # Every trace it lists is a legacy one.
    for row in worst[:3]:
        code, shown, err = run("trace", "show", row["trace_id"], "--database-url", url, "--format",
                               "json")  # fmt: skip
        assert code == 0, err
        assert json.loads(shown)["attributes"]["tags"] == ["legacy"]
    # A missed document's example: trace show marks it as not retrieved, the others by rank.
    missed = document["missed_references"][0]
    code, shown, err = run(*shlex.split(missed["drill"])[1:], "--format", "json")
    assert code == 0, err
    detail = json.loads(shown)
    marks = {m["id"]: m["rank"] for m in detail["reference_retrieval"]}
    assert marks["kb-never"] is None
    ids = [c["context_id"] for c in detail["contexts"]]
    for doc, rank in marks.items():
        assert rank == (ids.index(doc) + 1 if doc in ids else None)
    code, table, err = run(*shlex.split(missed["drill"])[1:])
    assert "kb-never  NOT retrieved" in table
    retrieved = [d for d, r in marks.items() if r is not None]
    if retrieved:
        assert f"{retrieved[0]}  retrieved at rank {marks[retrieved[0]]}" in table


def test_table_and_csv(url: str) -> None:
    table = diagnose(url, "--metric", ID_METRIC)
    assert "Slices: clustered by user (" in table
    assert "2 of " in table and "tested are significantly below the rest" in table
    assert "tag=legacy" in table and "document.index=v1-stale" in table
    assert "Missed reference documents" in table and "kb-never" in table
    assert "See the traces:" in table and "recalltrace scores worst" in table
    missed_rows = [line for line in table.split("Missed reference")[1].splitlines() if "│" in line]
    assert "kb-never" in missed_rows[0]
    rows = list(
        csv.DictReader(io.StringIO(diagnose(url, "--metric", ID_METRIC, "--format", "csv")))
    )
    sections = [r["section"] for r in rows]
    assert sections.count("slice") == 2 and "missed_reference" in sections
    first_missed = next(r for r in rows if r["section"] == "missed_reference")
    assert first_missed["value"] == "kb-never" and first_missed["retrieved"] == "0"
    assert all(r["drill"].startswith("recalltrace ") for r in rows)


def test_all_shows_every_slice_and_q_changes_the_rate(url: str) -> None:
    every = json.loads(diagnose(url, "--metric", ID_METRIC, "--all", "--limit", "100",
                                "--format", "json"))  # fmt: skip
    assert len(every["slices"]) == every["slices_tested"] > 2
    table = diagnose(url, "--metric", ID_METRIC, "--all", "--limit", "100")
    assert "Every slice tested, by impact" in table and "tag=web" in table
    strict = json.loads(diagnose(url, "--metric", ID_METRIC, "--q", "1e-12", "--format", "json"))
    assert strict["q"] == 1e-12
    assert len(strict["slices"]) <= 2
    small = json.loads(diagnose(url, "--metric", ID_METRIC, "--min-count", "500",
                                "--format", "json"))  # fmt: skip
    assert small["slices_skipped_small"] > 0 and small["min_count"] == 500


def test_unsupported_claims(url: str) -> None:
    document = json.loads(diagnose(url, "--metric", LLM_METRIC, "--format", "json"))
    claims = document["unsupported_claims"]
    assert claims[0]["claim"] == WARRANTY and claims[0]["unsupported_share"] > 0.8
    assert claims[0]["drill"].startswith("recalltrace trace show ")
    assert document["missed_references"] is None
    table = diagnose(url, "--metric", LLM_METRIC)
    assert "Unsupported claims" in table and WARRANTY in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --metric"),
        (["--metric", "no_such"], "unknown metric 'no_such'"),
        (["--metric", ID_METRIC, "--q", "2"], "expected a rate between 0 and 1"),
        (["--metric", ID_METRIC, "--min-count", "1"], "from 2 to"),
        (["--metric", ID_METRIC, "--where", "colour=red"], "unknown attribute 'colour'"),
    ],
)
def test_bad_input_is_one_line(url: str, args: list[str], message: str) -> None:
    code, out, err = run("scores", "diagnose", "--database-url", url, *args)
    assert code == 2, (out, err)
    assert message in err.strip().splitlines()[-1] and "Traceback" not in err


def test_an_empty_window_says_so_in_one_line(url: str) -> None:
    out = diagnose(url, "--metric", ID_METRIC, "--since", "2020-01-01", "--until", "2020-01-02")
    assert out.strip().startswith("No scored results of id_based_context_recall")
    assert len(out.strip().splitlines()) == 1


def test_as_a_new_process(url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["COLUMNS"] = "160"
    done = subprocess.run(
        [sys.executable, "-m", "recalltrace", "scores", "diagnose", "--metric", ID_METRIC,
         "--database-url", url],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tag=legacy" in done.stdout and "kb-never" in done.stdout


def test_stored_text_stays_inert_in_every_format(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tags, document metadata and reference ids come from users' traffic: escape sequences in
    them reach no terminal, and no CSV cell starts a formula."""

    evil = "\x1b]0;pwned\x07\x1b[2J\u202e"
    database = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'h.db'}"
    upgrade(database)
    engine = create_engine_from_url(database)
    repo = make_repository(engine, metrics=[ID_METRIC])
    rng = random.Random(3)
    records = traffic(rng, 80, app="=app", planted=True)
    for index, record in enumerate(records):
        record.tags = [f"=tag{evil}"] if index % 2 else ["+plain"]
        for context in record.retrieved_contexts:
            context.metadata = {"source": f"@src{evil}" if index % 2 else "-other"}
        record.reference_context_ids = [f"=doc{evil}", *(record.reference_context_ids or [])]
    score_all(repo, records, rng, planted=True)
    engine.dispose()
    for form in ("table", "json", "csv"):
        out = diagnose(database, "--metric", ID_METRIC, "--all", "--min-count", "2",
                       "--format", form)  # fmt: skip
        assert "tag" in out and "doc" in out
        for raw in ("\x1b", "\x07", "\u202e"):
            assert raw not in out, (form, out[:2000])
        if form == "csv":
            for row in csv.reader(io.StringIO(out)):
                for cell in row:
                    try:
                        float(cell)  # a number (a negative difference) is no formula
                    except ValueError:
                        assert not cell.startswith(("=", "+", "-", "@")), row


def test_a_drill_down_keeps_the_metric_version_it_was_given(url: str) -> None:
    """``--metric-version`` reaches the printed drill-downs as the option they take (a bare
    ``--version`` made every one of them exit 2)."""
    code, out, err = run("scores", "worst", "--database-url", url, "--metric", ID_METRIC,
                         "--format", "json", "--limit", "1")  # fmt: skip
    assert code == 0, err
    version = str(json.loads(out)[0]["version"])
    document = json.loads(
        diagnose(url, "--metric", ID_METRIC, "--metric-version", version, "--format", "json")
    )
    drills = [row["drill"] for row in document["slices"] + document["missed_references"]]
    assert drills
    for drill in drills[:4]:
        assert f"--metric-version {version}" in drill or drill.startswith("recalltrace trace ")
        code, _, err = run(*shlex.split(drill)[1:])
        assert code == 0, (drill, err)


def test_at_80_columns_no_slice_or_reference_is_cut(url: str) -> None:
    """The slice and reference columns are keys: at 80 columns a row becomes a block rather than
    ``tag=leg…`` (docs/cli.md, key columns are never cut)."""
    code, text, err = run(
        "scores", "diagnose", "--database-url", url, "--metric", ID_METRIC, columns=80
    )
    assert code == 0, err
    assert "tag=legacy" in text and "kb-never" in text, text
    table_lines = [line for line in text.splitlines() if line[:1] in "┃│┏┡└" or "…" in line]
    assert not [line for line in table_lines if "…" in line], text


def test_too_little_traffic_is_no_all_clear(url: str) -> None:
    """A window where no slice can be tested says so, and how much traffic a test needs,
    instead of "No slice is significantly below the rest"; what was not tested is named, with
    the option that tests it."""
    table = diagnose(url, "--metric", ID_METRIC, "--min-count", "500")
    assert "No slice is significantly below" not in table
    assert "Too little traffic to test any slice: 900 scored traces" in table
    assert "at least 1,000 in all" in table and "--min-count" in table
    assert "Not tested, fewer than 500 traces in the slice or its rest: " in table
    assert "release=2.4.1 (" in table and " more; test smaller slices with --min-count N" in table


def test_a_tag_with_an_invisible_character_prints_apart(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``web`` and ``web`` followed by a zero-width space are two slices; the second prints
    escaped, never as a second ``tag=web``."""
    database = f"sqlite:///{tmp_path_factory.mktemp('invisible') / 'i.db'}"
    upgrade(database)
    engine = create_engine_from_url(database)
    repo = make_repository(engine, metrics=[ID_METRIC])
    rng = random.Random(4)
    records = traffic(rng, 120, app="tags", planted=False)
    for index, record in enumerate(records):
        record.tags = ["web\u200b" if index % 3 == 0 else "web" if index % 3 == 1 else "wеb"]
    score_all(repo, records, rng, planted=False)
    engine.dispose()
    table = diagnose(database, "--metric", ID_METRIC, "--all", "--min-count", "2")
    assert "tag=web\\u200b" in table and "tag=w\\u0435b" in table
    assert "\u200b" not in table
    rows = [line for line in table.splitlines() if "│" in line and "tag=w" in line]
    shown = [re.search(r"tag=\S+", line).group() for line in rows]  # type: ignore[union-attr]
    assert sorted(shown) == ["tag=w\\u0435b", "tag=web", "tag=web\\u200b"], shown
