"""Every read command on a read-only Postgres database (a hot standby, or
``default_transaction_read_only``): the same output as on the writable copy of the same data,
no traceback, nothing written; the commands that must write say so in one line.

Two copies of one database with three days of scored traffic are made: one writable, one set
read-only with ``ALTER DATABASE ... SET default_transaction_read_only = on``. The read caches of
both start empty, so on the writable copy each read fills them, and on the read-only copy each
read must compute the same rows without storing them.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from recalltrace.storage.access import read_only
from recalltrace.storage.db import create_engine_from_url
from tests.support.cli import run_cli
from tests.support.databases import copied_postgres_database
from tests.support.diagnose_data import ID_METRIC, LLM_METRIC, score_all, traffic
from tests.support.factories import make_repository
from tests.support.postgres import admin_engine, require_postgres

CACHES = ("summary_cache", "group_cache", "cost_cache", "diagnose_cache")


@pytest.fixture(scope="module")
def copies() -> Iterator[tuple[str, str]]:
    """(writable URL, read-only URL) of two copies of the same scored traffic."""
    require_postgres()
    name = f"rt_ro_{uuid.uuid4().hex[:10]}"
    with copied_postgres_database(name) as source:
        engine = create_engine_from_url(source)
        repo = make_repository(engine, metrics=[ID_METRIC, LLM_METRIC])
        rng = random.Random(11)
        now = datetime.now(timezone.utc)
        for hours_ago in range(0, 72, 6):
            start = now - timedelta(hours=hours_ago)
            records = traffic(rng, 60, app="help-desk", planted=True, start=start)
            score_all(repo, records, rng, planted=True)
        engine.dispose()
        admin = admin_engine()
        urls = []
        try:
            for suffix in ("w", "r"):
                with admin.connect() as conn:
                    conn.execute(text(f'CREATE DATABASE "{name}_{suffix}" TEMPLATE "{name}"'))
                urls.append(source.replace(name, f"{name}_{suffix}"))
            with admin.connect() as conn:
                conn.execute(
                    text(f'ALTER DATABASE "{name}_r" SET default_transaction_read_only = on')
                )
            yield urls[0], urls[1]
        finally:
            with admin.connect() as conn:
                for suffix in ("w", "r"):
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}_{suffix}" WITH (FORCE)'))
            admin.dispose()


def _trace_id(url: str) -> str:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return str(conn.scalar(text("SELECT min(trace_id) FROM traces")))
    finally:
        engine.dispose()


def _cached_rows(url: str) -> int:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return sum(int(conn.scalar(text(f"SELECT count(*) FROM {t}")) or 0) for t in CACHES)
    finally:
        engine.dispose()


def _timeless(output: str) -> str:
    """``output`` with the moments a command computes from its clock (the start of
    ``--since 3d`` in a printed command) replaced: the two runs are a second apart."""
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<moment>", output)


READS = [
    ("scores", "summary", "--since", "3d"),
    ("scores", "summary", "--since", "3d", "--bucket", "hour", "--by", "release"),
    ("scores", "worst", "--since", "3d"),
    ("scores", "compare", "--since", "3d", "--metric", ID_METRIC, "--by", "tag"),
    ("scores", "compare", "--since", "3d", "--metric", LLM_METRIC, "--by", "release"),
    ("scores", "diagnose", "--since", "3d", "--metric", ID_METRIC),
    ("scores", "diagnose", "--since", "3d", "--metric", LLM_METRIC),
    ("scores", "cost", "--since", "3d"),
    ("scores", "agreement", "--since", "3d", "--metric", ID_METRIC),
    ("check", "--metric", ID_METRIC, "--min", "0.1", "--since", "3d"),
    ("doctor",),
    ("jobs", "list"),
    ("jobs", "counts"),
    ("db", "current"),
    ("db", "prune", "--older-than", "1d"),
]


def test_the_read_only_copy_is_read_only(copies: tuple[str, str]) -> None:
    writable, read_only_url = copies
    for url, expected in ((writable, False), (read_only_url, True)):
        engine = create_engine_from_url(url)
        try:
            assert read_only(engine) is expected
        finally:
            engine.dispose()


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c[:3]))
def test_every_read_gives_the_writable_answer_and_writes_nothing(
    copies: tuple[str, str], command: tuple[str, ...]
) -> None:
    writable, read_only_url = copies
    on_writable = run_cli(*command, "--database-url", writable)
    on_read_only = run_cli(*command, "--database-url", read_only_url)
    assert "Traceback" not in on_read_only.stderr, on_read_only.stderr[-3000:]
    assert on_read_only.returncode == on_writable.returncode, on_read_only.stderr
    shown = on_read_only.stdout.replace(read_only_url, writable)
    assert _timeless(shown) == _timeless(on_writable.stdout)
    assert on_read_only.stderr.replace(read_only_url, writable) == on_writable.stderr
    assert _cached_rows(read_only_url) == 0


def test_the_writable_copy_fills_its_caches(copies: tuple[str, str]) -> None:
    """The reads above are the ones that fill caches: on the writable copy they did."""
    writable, _ = copies
    run_cli("scores", "summary", "--since", "3d", "--database-url", writable)
    assert _cached_rows(writable) > 0


def test_trace_show_and_plot_read_the_same(copies: tuple[str, str], tmp_path: Path) -> None:
    writable, read_only_url = copies
    trace_id = _trace_id(writable)
    shown = [run_cli("trace", "show", trace_id, "--database-url", u) for u in copies]
    assert shown[1].returncode == 0, shown[1].stderr
    assert shown[1].stdout == shown[0].stdout
    for index, url in enumerate(copies):
        done = run_cli(
            "scores",
            "plot",
            "--since",
            "3d",
            "--out",
            str(tmp_path / f"{index}.svg"),
            "--database-url",
            url,
        )
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "0.svg").read_bytes() == (tmp_path / "1.svg").read_bytes()
    assert _cached_rows(read_only_url) == 0


WRITES = [
    ("worker", "--once"),
    ("backfill", "--metric", ID_METRIC, "--since", "1d"),
    ("jobs", "retry"),
    ("jobs", "cancel", "--metric", ID_METRIC),
    ("db", "prune", "--older-than", "1d", "--yes"),
    ("labels", "import", "labels.csv", "--labeller", "ana"),
]


@pytest.mark.parametrize("command", WRITES, ids=lambda c: " ".join(c[:2]))
def test_a_command_that_writes_says_so_in_one_line(
    copies: tuple[str, str], command: tuple[str, ...], tmp_path: Path
) -> None:
    (tmp_path / "labels.csv").write_text("trace_id,metric,score\n")
    _, read_only_url = copies
    done = run_cli(*command, "--database-url", read_only_url, cwd=tmp_path)
    name = " ".join(word for word in command[:2] if not word.startswith("-"))
    assert done.returncode == 2
    assert done.stderr == (
        f"recalltrace: error: the database is read-only: {name} needs to write; point it at "
        "the primary (a writable database)\n"
    )
