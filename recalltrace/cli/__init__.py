"""The ``recalltrace`` command line, one module per command group: :mod:`.db`, :mod:`.demo`,
:mod:`.scores` (one ``scores_*`` module per action), :mod:`.check`, :mod:`.trace`, :mod:`.jobs`
(with ``backfill``), :mod:`.worker`, :mod:`.collect`, :mod:`.doctor`, :mod:`.labels` and
:mod:`.ui`; shared argument parsing in :mod:`._args`, rendering in :mod:`._render`, charts in
:mod:`._charts`.

Every subcommand imports what it needs when it runs, so ``recalltrace --help`` stays fast and
the tracer's import path stays light. Errors a user can fix (a wrong database URL, an
un-migrated database, a bad argument) end in one clear line and exit code 2, not a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from recalltrace.cli import (
    check,
    collect,
    db,
    demo,
    doctor,
    jobs,
    labels,
    scores,
    trace,
    ui,
    worker,
)
from recalltrace.cli._args import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Handler,
    command_name,
    read_only_refusal,
    version_misplaced,
    writes,
)
from recalltrace.cli._render import inert

__all__ = ["EXIT_CHECK_FAILED", "EXIT_OK", "EXIT_USAGE", "CommandError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="recalltrace",
        description="Context-recall monitoring for production RAG: traces, scores, history.",
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print recalltrace's version (the installed distribution's) and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail")
    parser.add_argument(
        "--database-url",
        dest="global_database_url",
        metavar="URL",
        default=None,
        help="database URL for the command that follows (the same as the command's own "
        "--database-url, which wins when both are given)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # One line per command group, in the order of `recalltrace --help`.
    db.register(sub)
    demo.register(sub)
    scores.register(sub)
    check.register(sub)
    trace.register(sub)
    jobs.register(sub)
    worker.register(sub)
    collect.register(sub)
    doctor.register(sub)
    labels.register(sub)
    ui.register(sub)

    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Let every (sub)command's parser be found from what it parsed, so that an option it
    does not know is reported in its own words; and make each option that takes one value
    refuse a second, different one (:class:`_StoreOnce`)."""
    for action in parser._actions:
        if type(action) is argparse._StoreAction and action.nargs is None and action.option_strings:
            action.__class__ = _StoreOnce
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(command_parser=child)
                _remember_parsers(child)


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value: given twice with different values it is refused (argparse
    keeps the last one silently, so ``--metric a --metric b`` would act on b alone)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, object] = namespace.__dict__.setdefault("_given_once", {})
        if self.dest in given and given[self.dest] != values:
            # Said by ``_value_problem`` once parsing is done, in one line.
            namespace.__dict__.setdefault(
                "_given_twice",
                f"{option_string or self.dest} was given twice ({inert(str(given[self.dest]))} "
                f"and {inert(str(values))}): it takes one value",
            )
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


def _value_problem(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """What no command can take, said by the option's name: ``--`` as an option's value
    (``--app=--``: argparse drops the ``--`` and hands on an empty list in place of the one
    value the option takes), and a NUL character, which no path, URL or name holds (only a
    call from Python can pass one); and an option that takes one value given two."""
    twice: str | None = getattr(args, "_given_twice", None)
    if twice is not None:
        return twice
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
        single = isinstance(action, argparse._StoreAction) and action.nargs is None
        if single and value == [] and action.option_strings:
            return f"{name} needs a value ('--' is not one)"
        values = value if isinstance(value, list) else [value]
        if any(isinstance(item, str) and "\x00" in item for item in values):
            return f"{name}: a NUL character is not allowed"
    return None


def _unknown_options(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """One line naming what ``parser`` did not recognise and the options it has (the close
    ones when there are some)."""
    import difflib

    known = sorted(
        {
            option
            for action in parser._actions
            for option in action.option_strings
            if option.startswith("--") and action.help != argparse.SUPPRESS
        }
    )
    unknown = [item for item in extras if item.startswith("-")] or extras
    first = unknown[0].partition("=")[0]
    close = difflib.get_close_matches(first, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else f"its options: {', '.join(known)}"
    shown = " ".join(inert(item) for item in extras)
    return f"unrecognized arguments: {shown} ({hint})"


def _refuse_read_only(args: argparse.Namespace) -> None:
    """Refuse, in one line, a command that writes when its database is read-only (a hot
    standby, ``default_transaction_read_only``). A database that cannot be reached now is left
    to the command, which waits for it or says so in its own words."""
    from sqlalchemy.exc import DBAPIError

    from recalltrace.storage.access import read_only
    from recalltrace.storage.db import create_engine_from_url, resolve_database_url

    url = resolve_database_url(getattr(args, "database_url", None))
    if url.startswith("sqlite") and "://" in url:
        from sqlalchemy.engine import make_url

        path = make_url(url).database
        if not path or not os.path.exists(path):
            return  # a file to create, or a typo the command names
    engine = create_engine_from_url(url)
    try:
        refused = read_only(engine)
    except DBAPIError:
        return
    finally:
        engine.dispose()
    if refused:
        raise CommandError(read_only_refusal(command_name(args)))


def _friendly(exc: BaseException, command: str = "this command") -> str | None:
    """A one-line message for errors a user can fix, or None for real bugs."""
    from recalltrace._readings import database_problem

    if isinstance(exc, CommandError):
        return str(exc)
    return database_problem(exc, command)


_TIME_OPTIONS = ("--since", "--until", "--older-than", "--stuck-after")


def _attach_dash_values(argv: list[str]) -> list[str]:
    """``--since -1h`` would read ``-1h`` as an option ("expected one argument"): pass such a
    value as ``--since=-1h`` so that the time parser can say what is wrong with it."""
    fixed: list[str] = []
    index = 0
    while index < len(argv):
        item = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else None
        dash_value = following is not None and following[:1] == "-" and following[1:2].isdigit()
        if item in _TIME_OPTIONS and dash_value:
            fixed.append(f"{item}={following}")
            index += 2
            continue
        fixed.append(item)
        index += 1
    return fixed


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``recalltrace`` command."""
    import logging

    parser = build_parser()
    args, extras = parser.parse_known_args(
        _attach_dash_values(list(sys.argv[1:] if argv is None else argv))
    )
    where: argparse.ArgumentParser = getattr(args, "command_parser", parser)
    if extras:
        where.error(version_misplaced(where, extras) or _unknown_options(where, extras))
    problem = _value_problem(where, args)
    if problem is not None:
        where.error(problem)
    if getattr(args, "database_url", None) is None and args.global_database_url is not None:
        args.database_url = args.global_database_url
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.version:
        from recalltrace._version import installed_version

        print(f"recalltrace {installed_version()}")
        return EXIT_OK
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if writes(args):
            _refuse_read_only(args)
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = _friendly(exc, command_name(args))
        if message is None:
            raise
        from recalltrace.storage.db import redact_url

        url = getattr(args, "database_url", None)
        # A bare path holds no password, and replacing it would garble the example the
        # message gives (sqlite:///./recalltrace.db contains ./recalltrace.db).
        if url and "://" in url:
            message = message.replace(url, redact_url(url))
        print(f"recalltrace: error: {message}", file=sys.stderr)
        return EXIT_USAGE
