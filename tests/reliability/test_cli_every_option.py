"""Every option of every command, given what a script or a slip of the hand passes: ``--`` as
its value (``--app=--``, which argparse turns into an empty list), an empty string, a NUL, a
lone surrogate and a value that looks like an option. The options are read from the parser
itself, so a new one is tried as soon as it exists. Each call ends with a result or a one-line
error, never a traceback, and never hangs (commands that would serve or wait run with their
one-shot options or a database that is not there)."""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from recalltrace.cli import build_parser, main

HOSTILE = ["--", "", "\x00", "\udcff", "-x"]
# Commands that would run until stopped, or open a real server: left out here (their options
# are read by the same parser; ``collect``'s and the worker's own tests run them).
LONG_RUNNING = {("collect",), ("worker",), ("demo",), ("ui",)}


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _commands(child, (*prefix, name))
    if prefix and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        found.append((prefix, parser))
    return found


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    return [
        action.dest
        for action in parser._actions
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
    ]


def _single_valued(parser: argparse.ArgumentParser) -> list[str]:
    return [
        action.option_strings[-1]
        for action in parser._actions
        if isinstance(action, argparse._StoreAction)
        and action.nargs is None
        and action.option_strings
    ]


PARSERS = dict(_commands(build_parser()))
CASES = [
    (command, option)
    for command, parser in _commands(build_parser())
    if command[:1] not in {c[:1] for c in LONG_RUNNING}
    for option in _single_valued(parser)
]


POSITIONAL = [
    (command, len(_positionals(parser)))
    for command, parser in _commands(build_parser())
    if command[:1] not in {c[:1] for c in LONG_RUNNING} and _positionals(parser)
]


@pytest.mark.parametrize(
    ("command", "count"), POSITIONAL, ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v)
)
def test_a_hostile_positional_gets_one_line(
    tmp_path: Path, command: tuple[str, ...], count: int
) -> None:
    """A command's own arguments (a file to import, a trace id), each hostile value in turn,
    with the options the command requires given."""
    parser = PARSERS[command]
    required = []
    for action in parser._actions:
        if action.required and action.option_strings:
            required += [action.option_strings[-1], "x"]
    for value in HOSTILE[1:]:
        argv = [*command, *required, "--database-url", f"sqlite:///{tmp_path / 'none.db'}"]
        argv += ["--", *([value] * count)] if value.startswith("-") else [value] * count
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 2
        assert code != 0 and "Traceback" not in err.getvalue(), (argv, err.getvalue())
        assert len(err.getvalue().strip().splitlines()[-1]) < 400


def test_every_command_and_option_is_tried() -> None:
    assert len(CASES) > 60, len(CASES)


@pytest.mark.parametrize(
    ("command", "option"), CASES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_a_hostile_value_gets_one_line(
    tmp_path: Path, command: tuple[str, ...], option: str
) -> None:
    missing = f"sqlite:///{tmp_path / 'absent' / 'none.db'}"
    for value in HOSTILE:
        out, err = io.StringIO(), io.StringIO()
        argv = [*command, f"{option}={value}"]
        if option != "--database-url":
            argv += ["--database-url", missing] if _takes_database(command) else []
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 2
        text = err.getvalue()
        assert "Traceback" not in text, (argv, text)
        if value == "--":
            last = text.strip().splitlines()[-1]
            assert code == 2 and "error:" in last, (argv, code, text)
            # Said by its name, unless another option the command requires is missing.
            assert last.endswith(f"{option} needs a value ('--' is not one)") or (
                "arguments are required" in last
            ), last


def _takes_database(command: tuple[str, ...]) -> bool:
    return "--database-url" in _single_valued(PARSERS[command])
