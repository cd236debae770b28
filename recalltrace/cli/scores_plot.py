"""``recalltrace scores plot``: the mean recall per metric over time, charted as a self-contained
HTML page or an SVG image."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from recalltrace.cli._args import (
    EXIT_OK,
    CommandError,
    _add_bucket,
    _add_common,
    _add_where,
    _attribute_name,
    _database,
    _piped,
)
from recalltrace.cli._charts import render_html, render_svg
from recalltrace.cli._scores_query import nothing_hint, summary_rows


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores plot``."""
    plot = scores_sub.add_parser(
        "plot",
        help="chart recall over time per metric (HTML page or SVG)",
        description="Chart the mean recall per metric over time, with the number of scored "
        "results per bucket, as a self-contained HTML page (.html) or an SVG image (.svg).",
    )
    _add_common(plot, metric_help="only this metric (default: every metric)")
    _add_where(plot)
    plot.add_argument(
        "--by",
        type=_attribute_name,
        default=None,
        metavar="ATTR",
        help="one line per value of this attribute (and metric), e.g. --by release",
    )
    _add_bucket(plot)
    plot.add_argument(
        "--out", required=True, metavar="FILE", help="output file: FILE.html or FILE.svg"
    )
    plot.set_defaults(handler=_piped(_cmd_plot))


def _cmd_plot(args: argparse.Namespace) -> int:
    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in (".html", ".htm", ".svg"):
        if suffix == ".png":
            raise CommandError(
                "PNG output is not supported; write a self-contained page with --out "
                f"{out.with_suffix('.html')} or an image with --out {out.with_suffix('.svg')}"
            )
        raise CommandError(f"cannot tell the chart format from {args.out!r}: use .html or .svg")
    try:
        is_folder, parent_exists = out.is_dir(), out.parent.is_dir()
    except OSError as exc:  # a name too long for the file system, say
        raise CommandError(f"cannot write {args.out!r}: {exc.strerror or exc}") from None
    if is_folder:
        raise CommandError(f"{args.out!r} is a folder: give a file name ending in .html or .svg")
    if not parent_exists:
        raise CommandError(f"the folder of {args.out!r} does not exist")
    with _database(args) as engine:
        rows, window = summary_rows(args, engine)
        hint = "" if rows else nothing_hint(args, engine)
    if hint:
        print(f"recalltrace: {hint}", file=sys.stderr)
    title = f"Context recall by {args.bucket}" + (f", app {args.app}" if args.app else "")
    lines = rows
    if args.by is not None:
        title += f" and {args.by}"
        # One series per (metric, group): the legend names both.
        lines = [
            replace(r, metric=f"{r.metric} {'(none)' if r.group is None else r.group}")
            for r in rows
        ]
    svg = render_svg(lines, bucket=args.bucket, title=title, subtitle=window)
    if suffix == ".svg":
        document = '<?xml version="1.0" encoding="UTF-8"?>\n' + svg
    else:
        document = render_html(rows, svg=svg, bucket=args.bucket, title=title, subtitle=window)
    try:
        out.write_text(document, encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {args.out!r}: {exc.strerror or exc}") from None
    print(f"wrote {out} ({len(rows)} bucket rows, {window})")
    return EXIT_OK
