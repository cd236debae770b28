"""How often ``scores diagnose`` names a slice, and ``scores compare`` a release, in traffic
without any cause, when requests come in sessions and from repeat users.

Per shape (clusters of users or sessions, their mean size, the spread of their levels of
recall; :mod:`tests.support.clustered_traffic`) it stores ``--apps`` apps of ``--traces``
requests each in a fresh SQLite database through the real repository, diagnoses each app at
q = 0.05 and compares its releases (``--by release``), and prints:

- the share of apps where the diagnosis names any slice (better or worse): the promise is at
  most 5%;
- the share of release differences whose 95% interval excludes zero: 5% expected.

``--independent`` runs the same with the clusters ignored (every trace independent, the
diagnosis before clustering) for comparison. Exits 1 when the pooled share of apps naming a
slice is above 5%, or any shape's is above its one-sided 99% binomial limit at 5%.

    python -m benchmarks.diagnose_null [--apps 40] [--traces 300] [--seed 46] [--independent]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
import tempfile
import time
from contextlib import redirect_stdout
from datetime import datetime, timedelta, timezone
from pathlib import Path

from recalltrace.cli import main as cli
from recalltrace.storage import diagnose_clusters
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support.clustered_traffic import METRIC, Shape, app_traffic, score_values
from tests.support.factories import make_history, make_repository

SHAPES = [
    Shape("session", 5, 0.1),
    Shape("session", 5, 0.2),
    Shape("session", 10, 0.1),
    Shape("session", 10, 0.2),
    Shape("session", 30, 0.1),
    Shape("session", 30, 0.2),
    Shape("user", 5, 0.2),
    Shape("user", 10, 0.1),
    Shape("user", 10, 0.2),
    Shape("user", 30, 0.2),
    Shape("user", 30, 0.2, tenants=60),
]
TARGET = 0.05


def binomial_limit(n: int, p: float = TARGET, level: float = 0.99) -> int:
    """The least k with P(X <= k) >= level for X ~ Binomial(n, p)."""
    total = 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if total >= level:
            return k
    return n


def _name(shape: Shape, index: int) -> str:
    return f"{shape.key}-{shape.size}-{shape.spread}-{shape.tenants}-{index:03d}"


def _compare(url: str, app: str) -> list[dict[str, object]]:
    out = io.StringIO()
    with redirect_stdout(out):
        cli(["scores", "compare", "--database-url", url, "--metric", METRIC, "--app", app,
             "--by", "release", "--since", "2d", "--min-traces", "10",
             "--format", "json"])  # fmt: skip
    groups: list[dict[str, object]] = json.loads(out.getvalue())["groups"]
    return groups


def run(apps: int, traces: int, seed: int, independent: bool) -> int:
    if independent:
        diagnose_clusters.choose_keys = lambda pinned, present: ()  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'null.db'}"
        upgrade(url)
        engine = create_engine_from_url(url)
        repo = make_repository(engine, metrics=[METRIC])
        rng = random.Random(seed)
        started = time.perf_counter()
        for shape in SHAPES:
            records, values = [], {}
            for index in range(apps):
                more, scores = app_traffic(rng, traces, app=_name(shape, index), shape=shape)
                records += more
                values.update(scores)
            score_values(repo, records, values)
        print(f"stored {len(SHAPES) * apps * traces:,} scored requests in "
              f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        history = make_history(engine)
        since = datetime.now(timezone.utc) - timedelta(days=1)
        mode = "independent traces (clusters ignored)" if independent else "clustered"
        print(f"\n{mode}; {apps} apps of {traces} requests per shape, q = 0.05")
        print(f"{'shape':<34} {'apps naming a slice':>20} {'release CIs excluding 0':>24}")
        pooled = 0
        failed = False
        for shape in SHAPES:
            named = judged = excluded = 0
            for index in range(apps):
                app = _name(shape, index)
                found = history.diagnose(metric=METRIC, since=since, app=app)
                named += found.significant > 0
                for group in _compare(url, app):
                    if group["verdict"] in ("worse", "better", "no detectable difference"):
                        judged += 1
                        excluded += group["verdict"] != "no detectable difference"
            pooled += named
            failed |= named > binomial_limit(apps)
            label = f"{shape.key}s of ~{shape.size}, spread {shape.spread}" + (
                f", {shape.tenants} tenant tags" if shape.tenants else ""
            )
            share = excluded / judged if judged else 0.0
            print(f"{label:<34} {named:>5} of {apps} ({named / apps:>5.1%}) "
                  f"{excluded:>6} of {judged} ({share:.1%})")  # fmt: skip
        total = apps * len(SHAPES)
        print(f"{'pooled':<34} {pooled:>5} of {total} ({pooled / total:.1%}); target at most "
              f"{TARGET:.0%}, per shape at most {binomial_limit(apps)} of {apps}")  # fmt: skip
        engine.dispose()
    return 1 if failed or pooled / total > TARGET else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, default=40, help="apps per shape (default 40)")
    parser.add_argument("--traces", type=int, default=300, help="requests per app (300)")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--independent", action="store_true",
                        help="ignore the clusters (the diagnosis before clustering)")  # fmt: skip
    args = parser.parse_args(argv)
    return run(args.apps, args.traces, args.seed, args.independent)


if __name__ == "__main__":
    sys.exit(main())
