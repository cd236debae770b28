"""What the score-history commands share: the rows of ``scores summary`` (also charted by
``scores plot``) and the hint when a filtered query found nothing."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from recalltrace.cli._args import (
    CommandError,
    _data_window,
    _history,
    _metric_version,
    _window,
)
from recalltrace.cli._render import (
    _window_text,
    inert,
    known_names,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from recalltrace.storage.history import SummaryRow


def nothing_hint(args: argparse.Namespace, engine: Engine) -> str:
    """Why a filtered query may have found nothing: an --app or --version that has no scores
    at all, with the names that do (and the closest one). Empty when the filters exist."""
    history = _history(engine)
    hints = []
    app = getattr(args, "app", None)
    if app is not None:
        apps = history.app_names()
        if app not in apps:
            hints.append(
                f"no app {inert(app)!r} has scores; apps with scores: {known_names(app, apps)}"
            )
    version = getattr(args, "metric_version", None)
    metric = getattr(args, "metric", None)
    if version is not None and metric:
        versions = history.versions_of(metric)
        if version not in versions:
            known = ", ".join(inert(v) for v in versions) or "none yet"
            hints.append(f"{metric} has no scores of version {inert(version)!r}; versions: {known}")
    return "; ".join(hints)


def summary_rows(args: argparse.Namespace, engine: Engine) -> tuple[list[SummaryRow], str]:
    metric, version = _metric_version(args)
    since, until = _window(args)
    bounded = _data_window(engine, since, until)
    try:
        rows = _history(engine).summary(
            bucket=args.bucket,
            since=bounded[0],
            until=bounded[1],
            app=args.app,
            metric=metric,
            version=version,
            where=args.where,
            by=getattr(args, "by", None),
        )
    except ValueError as exc:  # too many groups for --by
        raise CommandError(str(exc)) from None
    return rows, _window_text(since, until)
