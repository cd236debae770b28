"""``--version`` has one meaning: recalltrace's own version. A metric's version is
``--metric-version``; the old use of ``--version`` after a command fails in one line that names
the new option."""

from __future__ import annotations

import contextlib
import io

import pytest

from recalltrace._version import installed_version
from recalltrace.cli import EXIT_OK, EXIT_USAGE, build_parser, main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_info:
            code = int(exit_info.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_recalltrace_version_prints_the_program_version() -> None:
    assert run("--version") == (EXIT_OK, f"recalltrace {installed_version()}\n", "")


def test_a_metric_version_is_named_metric_version() -> None:
    for command in (
        ("scores", "summary"),
        ("scores", "worst"),
        ("scores", "compare", "--by=release"),
    ):
        args = build_parser().parse_args([*command, "--metric", "m", "--metric-version", "2"])
        assert args.metric_version == "2"
    args = build_parser().parse_args(["check", "--metric", "m", "--metric-version", "2"])
    assert args.metric_version == "2"


@pytest.mark.parametrize(
    "argv",
    [
        ("scores", "summary", "--metric", "llm_context_recall", "--version", "1"),
        ("scores", "worst", "--metric", "llm_context_recall", "--version=1"),
        ("scores", "plot", "--version", "1", "--out", "x.svg"),
        ("check", "--metric", "llm_context_recall", "--min", "0.5", "--version", "0"),
        ("scores", "summary", "--version"),
    ],
)
def test_version_after_a_command_names_metric_version(argv: tuple[str, ...]) -> None:
    code, out, err = run(*argv)
    assert code == EXIT_USAGE and out == ""
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert "--metric-version V" in line and "recalltrace --version" in line, line


def test_version_after_a_command_without_metric_versions_says_where_it_goes() -> None:
    code, _out, err = run("jobs", "list", "--version")
    assert code == EXIT_USAGE
    line = err.strip().splitlines()[-1]
    assert "recalltrace --version" in line and "--metric-version" not in line, line


def test_metric_version_without_a_metric_is_refused_by_its_name() -> None:
    code, _out, err = run("scores", "worst", "--metric-version", "1", "--database-url", "x://")
    assert code == EXIT_USAGE
    assert "--metric-version needs --metric" in err
