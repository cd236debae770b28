"""``recalltrace scores ACTION``: the score history, one module per action.

Each action's module adds its own parser and handler with ``register(scores_sub)``; the list
below is the one place where the actions are registered (a new action: a new module and one line
here)."""

from __future__ import annotations

import argparse

from recalltrace.cli import (
    diagnose,
    scores_agreement,
    scores_compare,
    scores_cost,
    scores_plot,
    scores_summary,
    scores_worst,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores`` and its actions."""
    scores = sub.add_parser("scores", help="query the history of stored scores")
    scores_sub = scores.add_subparsers(dest="scores_command", metavar="ACTION", required=True)
    # The order of ``recalltrace scores --help``.
    scores_summary.register(scores_sub)
    scores_worst.register(scores_sub)
    scores_plot.register(scores_sub)
    scores_compare.register(scores_sub)
    diagnose.register(scores_sub)
    scores_cost.register(scores_sub)
    scores_agreement.register(scores_sub)
