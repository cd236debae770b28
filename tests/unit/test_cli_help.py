"""Every command's and subcommand's ``--help`` (and ``-h``) prints its text and exits 0."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from recalltrace.cli import build_parser, main


def _command_paths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths.extend(_command_paths(sub, (*prefix, name)))
    return paths


PATHS = _command_paths(build_parser())


def test_the_walk_finds_the_nested_commands() -> None:
    assert ("scores", "summary") in PATHS
    assert len(PATHS) > 20


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "recalltrace")
def test_help_prints_and_exits_zero(path: tuple[str, ...], flag: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        pytest.raises(SystemExit) as exit_info,
    ):
        main([*path, flag])
    assert exit_info.value.code == 0, err.getvalue()
    assert "usage:" in out.getvalue()
    assert "Traceback" not in err.getvalue()
