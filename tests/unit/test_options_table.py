"""Each tracer option is written once, in TracerConfig's table; configure() and the docs follow.

``configure()`` keeps typed keywords for editors, so this test is what holds its signature, the
environment variables and the documented table to the table in ``tracer/_config.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import recalltrace
from recalltrace.tracer import TracerConfig
from recalltrace.tracer._config import env_sources
from tests.support import ROOT

# Options that are not configure() keywords: set on a TracerConfig only.
CONFIG_ONLY = {"register_atexit"}


def documented_rows(path: str) -> dict[str, str]:
    """``{option: environment cell}`` of the options table in a markdown file."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| option | environment"))
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        match = re.match(r"^\|\s*`(\w+)`\s*\|\s*([^|]*?)\s*\|", line)
        if match is None:
            break
        rows[match.group(1)] = match.group(2)
    return rows


def test_configure_takes_exactly_the_options_of_the_table() -> None:
    fields = {f.name for f in dataclasses.fields(TracerConfig)}
    parameters = set(inspect.signature(recalltrace.configure).parameters) - {"config"}
    assert parameters == fields - CONFIG_ONLY


def test_every_option_reads_the_variables_its_table_row_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {
        "RECALLTRACE_DATABASE_URL": ("database_url", "sqlite:///x.db", "sqlite:///x.db"),
        "RECALLTRACE_SAMPLE_RATE": ("sample_rate", "0.25", 0.25),
        "RECALLTRACE_SAMPLE_RATES": ("sample_rates", "a=0.5,b=1", {"a": 0.5, "b": 1.0}),
        "RECALLTRACE_MAX_QUEUE_SIZE": ("max_queue_size", "7", 7),
        "RECALLTRACE_FLUSH_INTERVAL": ("flush_interval", "0.2", 0.2),
        "RECALLTRACE_SCRUBBING": ("scrubbing", "0", False),
        "RECALLTRACE_ENABLED": ("enabled", "0", False),
        "RECALLTRACE_TRACER_PROVIDER": ("tracer_provider", "own", "own"),
    }
    for variable, (name, raw, expected) in values.items():
        assert variable in {v for v, _ in env_sources(name)}
        monkeypatch.setenv(variable, raw)
        assert getattr(TracerConfig.from_env(), name) == expected, variable
        monkeypatch.delenv(variable)


def test_a_variable_that_cannot_be_read_is_ignored_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RECALLTRACE_MAX_BATCH_SIZE", "lots")
    assert TracerConfig.from_env().max_batch_size == 256
    (message,) = [r.getMessage() for r in caplog.records]
    assert "RECALLTRACE_MAX_BATCH_SIZE" in message and "not an integer" in message


@pytest.mark.parametrize("path", ["docs/tracing.md"])
def test_the_documented_table_lists_every_option_with_its_variables(path: str) -> None:
    rows = documented_rows(path)
    fields = {f.name for f in dataclasses.fields(TracerConfig)} - CONFIG_ONLY
    assert set(rows) == fields
    for name, cell in rows.items():
        documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)", cell))
        assert documented == {v for v, _ in env_sources(name)}, name


def test_the_readme_table_is_a_subset_with_the_same_variables() -> None:
    rows = documented_rows("README.md")
    fields = {f.name for f in dataclasses.fields(TracerConfig)}
    for name, cell in rows.items():
        if name not in fields:
            continue  # the worker's rows of the same table
        documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)", cell))
        assert documented <= {v for v, _ in env_sources(name)}, name


def test_the_worker_flags_are_the_flagged_worker_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from recalltrace.cli import build_parser, main
    from recalltrace.scorers.worker import WorkerOptions

    flagged = {f.name: f for f in dataclasses.fields(WorkerOptions) if "flag" in f.metadata}
    assert {"concurrency", "lease_s", "grace_period_s", "reference_ttl_s"} <= set(flagged)
    args = build_parser().parse_args(["worker"])
    for name, option in flagged.items():
        assert getattr(args, name) == option.default, name
    help_text = " ".join(
        build_parser()._subparsers._group_actions[0].choices["worker"].format_help().split()
    )  # type: ignore[union-attr]
    for option in flagged.values():
        assert option.metadata["flag"] in help_text
        assert " ".join(option.metadata["help"].split()) in help_text
    with pytest.raises(SystemExit) as exit_info:
        main(["worker", "--lease", "nan"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "--lease: expected a positive number of seconds, got 'nan'" in line


def test_every_worker_option_says_what_it_does_and_its_default() -> None:
    from recalltrace.cli import build_parser

    worker = build_parser()._subparsers._group_actions[0].choices["worker"]  # type: ignore[union-attr]
    for action in worker._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.option_strings
        if action.nargs == 0:  # an on/off flag: its default is "off"
            continue
        help_text = action.help % {"default": action.default}
        assert "default" in help_text, action.option_strings
