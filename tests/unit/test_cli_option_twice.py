"""An option that takes one value, given twice with different values, is refused in the
parser's one error line (argparse kept the last value silently: ``jobs cancel --metric a
--metric b`` cancelled b's jobs alone); given twice with the same value it is taken."""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from recalltrace.cli import build_parser, main


def _single_valued() -> list[tuple[list[str], str]]:
    """Each (command path, option) of every parser whose option takes one plain string."""
    found: list[tuple[list[str], str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        # A command with required arguments stops at them first (argparse's own line).
        if any(action.required for action in parser._actions):
            return
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])
            elif (
                type(action).__name__ == "_StoreOnce"
                and action.type is None
                and action.choices is None
                and path
            ):
                found.append((path, action.option_strings[-1]))

    walk(build_parser(), [])
    return found


CASES = _single_valued()


def test_there_are_many_such_options() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize(("path", "option"), CASES, ids=[" ".join(p) + o for p, o in CASES])
def test_two_different_values_are_refused(path: list[str], option: str) -> None:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as ended:
        main([*path, option, "alpha", option, "beta"])
    assert ended.value.code == 2
    last = err.getvalue().strip().splitlines()[-1]
    assert f"{option} was given twice (alpha and beta): it takes one value" in last
    assert "Traceback" not in err.getvalue()


def test_the_same_value_twice_is_taken() -> None:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as ended:
        main(["scores", "worst", "--app", "a", "--app", "a", "--bogus"])
    # It got past the repeated --app to the unknown option.
    assert ended.value.code == 2
    assert "unrecognized arguments: --bogus" in err.getvalue()
