"""Several hundred generated invocations of the real command line (``recalltrace.cli.main`` in
process) with what users and scripts actually pass by mistake: durations that overflow the
calendar, dates at its edges, output paths that are directories, files that are not databases,
another application's SQLite file, a mistyped path, every integer option given what does not fit
it, and windows and limits far beyond the data. Each ends with a result or a one-line error,
never a traceback, and no mistyped path becomes a database."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from recalltrace.cli import main
from recalltrace.storage.migrate import upgrade
from tests.support.factories import make_repository, make_trace

TIME_VALUES = [
    "3000000d", "999999999999w", "99999999d", "1e309s", "10000000000000000000000000s",
    "0s", "0.0000001s", "1.5h", "７d", "1d\x00", "\udcff", "", " ", "now", "NOW", "-1h",
    "0001-01-01", "0001-01-01T00:00:00+14:00", "9999-12-31", "9999-12-31T23:59:59-12:00",
    "2026-02-30", "2026-13-01", "1969-12-31T23:59:59Z", "2026-11-24T25:00:00",
    "2026-11-24T10:00:00+99:00",
]  # fmt: skip
TIME_OPTIONS = {
    ("scores", "summary"): ["--since", "--until"],
    ("scores", "worst"): ["--since", "--until"],
    ("check", "--metric", "id_based_context_recall", "--min", "0.5"): ["--since", "--until"],
    ("jobs", "list"): ["--since", "--until", "--stuck-after"],
    ("db", "prune"): ["--older-than"],
    ("backfill",): ["--since", "--until"],
    ("doctor",): ["--since", "--until"],
    ("scores", "compare", "--metric", "id_based_context_recall"): ["--since", "--until"],
    ("scores", "cost"): ["--since", "--until"],
}
# Commands that also write CSV: each hostile window is asked for in CSV too.
CSV_COMMANDS = {("scores", "summary"), ("scores", "worst"), ("jobs", "list"), ("scores", "cost")}
DATABASE_COMMANDS = [
    ("scores", "summary"),
    ("scores", "worst"),
    ("check", "--metric", "id_based_context_recall", "--min", "0.5"),
    ("trace", "show", "abcdef12"),
    ("jobs", "list"),
    ("jobs", "counts"),
    ("jobs", "retry"),
    ("jobs", "cancel", "--all"),
    ("backfill",),
    ("db", "current"),
    ("db", "prune", "--older-than", "1d"),
    ("worker", "--once", "--no-progress"),
    ("doctor",),
    ("scores", "cost", "--format", "csv"),
    ("db", "upgrade"),
]

# Values no integer option takes: below every range, beyond a bigint, not whole numbers.
BAD_INTEGERS = [
    "-1", "9223372036854775808", "99999999999999999999999999", "1e3", "1.5", "", " ", "0x10",
    "nan", "inf", "1_000_000_000_000_000_000_000", "\udcff", "7d",
]  # fmt: skip
# What a command needs besides the option under test, to get as far as parsing it.
REQUIRED = {
    ("trace", "show"): ["abcdef12"],
    ("check",): ["--metric", "id_based_context_recall", "--min", "0.5"],
    ("scores", "agreement"): ["--metric", "judge_context_recall"],
    ("scores", "compare"): ["--metric", "id_based_context_recall"],
    ("scores", "plot"): ["--out", "chart.svg"],
    ("labels", "import"): ["labels.csv", "--labeller", "me"],
    ("db", "prune"): ["--older-than", "1d"],
    ("worker",): ["--once"],
}


def integer_options() -> list[tuple[tuple[str, ...], str, int]]:
    """Every (command, option, lowest value) whose option takes a whole number, found by walking
    the real parser: the integer options use the one shared parser, which names its range."""
    import argparse

    from recalltrace.cli import build_parser

    found: list[tuple[tuple[str, ...], str, int]] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    # collect (an OTLP receiver) checks its own options.
                    if name not in ("collect",):
                        walk(child, (*path, name))
            elif action.option_strings and action.type is int:
                pytest.fail(f"{path} {action.option_strings[0]} parses with bare int()")
            elif action.option_strings and getattr(action.type, "__name__", "").startswith("int_"):
                low = int(action.type.__name__.split("_")[1])
                found.append((path, action.option_strings[0], low))

    walk(build_parser(), ())
    return found


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusing a value
        code = int(exc.code or 0)
    except Exception as exc:  # a traceback is exactly what must not happen
        pytest.fail(f"{argv!r} raised {type(exc).__name__}: {exc}")
    return code, capsys.readouterr().err


def assert_clean(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, argv
    assert code in (0, 1, 2, 3, 4), (argv, code, err)
    if code == 2:
        lines = [line for line in err.strip().splitlines() if "error:" in line]
        assert len(lines) == 1, (argv, err)


@pytest.fixture
def stored(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'recalltrace.db'}"
    upgrade(url)
    from recalltrace.storage.db import create_engine_from_url

    repo = make_repository(create_engine_from_url(url), metrics=["id_based_context_recall"])
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(3)])
    repo.dispose()
    return url


def test_hundreds_of_hostile_invocations_end_cleanly(
    stored: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = 0
    for (command, options), value in itertools.product(TIME_OPTIONS.items(), TIME_VALUES):
        for option in options:
            argv = [*command, "--database-url", stored, f"{option}={value}"]
            if command in CSV_COMMANDS and runs % 2:
                argv += ["--format", "csv"]
            code, err = run_cli(argv, capsys)
            assert_clean(argv, code, err)
            runs += 1
    # Charts written where they cannot be.
    plot = ["scores", "plot", "--database-url", stored, "--since", "2d"]
    unwritable = tmp_path / "read-only"
    unwritable.mkdir(mode=0o500)
    outs = [
        str(tmp_path), str(tmp_path / "missing" / "c.svg"), str(tmp_path / "c.png"),
        str(tmp_path / "c.txt"), str(unwritable / "c.svg"), "", "/dev/null/c.svg",
        str(tmp_path / ("x" * 300 + ".svg")),
    ]  # fmt: skip
    for out in outs:
        for value in TIME_VALUES[:8]:
            argv = [*plot, "--out", out, "--until", value]
            code, err = run_cli(argv, capsys)
            assert_clean(argv, code, err)
            runs += 1
    assert runs >= 300, runs


def test_files_that_are_not_recalltrace_databases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00\x01not a database at all" * 50)
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    folder = tmp_path / "folder.db"
    folder.mkdir()
    missing = tmp_path / "typo.db"
    for path, command in itertools.product(
        (junk, damaged, foreign, folder, missing), DATABASE_COMMANDS
    ):
        argv = [*command, "--database-url", f"sqlite:///{path}"]
        code, err = run_cli(argv, capsys)
        assert_clean(argv, code, err)
        if command[:2] != ("db", "upgrade"):
            assert code != 0 or path is missing, (argv, err)
            assert not missing.exists(), f"{argv!r} created a database at a mistyped path"
        if path is foreign:
            # Nothing adds tables to another application's database without being asked.
            with sqlite3.connect(foreign) as connection:
                tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
            assert tables == {"users"}, argv
    # db upgrade creates a new file, and adds to a foreign one only when asked.
    assert missing.exists()
    code, err = run_cli(
        ["db", "upgrade", "--into-existing", "--database-url", f"sqlite:///{foreign}"], capsys
    )
    assert code == 0, err
    with sqlite3.connect(foreign) as connection:
        tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
    assert {"users", "traces", "scores"} <= tables


def test_no_integer_option_takes_what_does_not_fit_it(
    stored: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    options = integer_options()
    # Every command that takes a count: the limits, the ids, the sizes, the demo's --top-k.
    named = {(path[-1], option) for path, option, _low in options}
    assert {("doctor", "--limit"), ("worst", "--limit"), ("show", "--max-chars")} <= named
    runs = 0
    for (path, option, low), value in itertools.product(options, BAD_INTEGERS):
        if value == "-1" and low < 0:
            continue
        argv = [*path, *REQUIRED.get(path, []), f"{option}={value}", "--database-url", stored]
        if path == ("demo",):
            argv.remove("--database-url")
            argv.remove(stored)
        code, err = run_cli(argv, capsys)
        assert code == 2, (argv, code, err)
        assert_clean(argv, code, err)
        assert option in err, (argv, err)
        runs += 1
    assert runs >= 100, runs


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_windows_and_limits_far_beyond_the_data_answer_on_postgres(
    pg_engine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--since 0001-01-01`` used to walk every hour since year 1 in the rollups, and a limit
    of ten million to read that many rows: both are bounded by the data or refused."""
    url = pg_engine.url.render_as_string(hide_password=False)
    repo = make_repository(pg_engine, metrics=["id_based_context_recall"])
    traces = [make_trace(reference_context_ids=["doc_0"]) for _ in range(4)]
    for index, trace in enumerate(traces):
        trace.release = f"2.{index % 2}.0"
    repo.write_traces(traces)
    from recalltrace.scorers.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(database_url=url, metrics=["id_based_context_recall"]))
    try:
        asyncio.run(worker.run(once=True))
    finally:
        worker.close()
    far = ["--since", "0001-01-01", "--until", "9999-12-31", "--database-url", url]
    for argv in (
        ["scores", "compare", "--metric", "id_based_context_recall", "--by", "release", *far],
        ["scores", "compare", "--metric", "id_based_context_recall", "--by", "release",
         "--format", "csv", *far],
        ["scores", "summary", "--by", "release", *far],
        ["scores", "cost", *far],
        ["scores", "worst", "--limit", "10000", *far],
        ["check", "--metric", "id_based_context_recall", "--min", "0.1", *far],
        ["doctor", "--limit", "1000000", *far],
    ):  # fmt: skip
        code, err = run_cli(argv, capsys)
        assert code == 0, (argv, err)
    for argv in (["scores", "worst", "--limit", "10000000", *far[-2:]],
                 ["doctor", "--limit", "9223372036854775808", *far[-2:]]):  # fmt: skip
        code, err = run_cli(argv, capsys)
        assert code == 2 and "expected a whole number from 1 to" in err, (argv, err)
