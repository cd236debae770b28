"""Latency of the history queries on Postgres with a million (or ten million) stored scores.

Creates a dedicated database (``rt_bench_history``) on the benchmark server (see
``benchmarks/_pg.py``: ``$RECALLTRACE_BENCH_DATABASE_URL``, else the test server), fills it
server-side (``INSERT ... SELECT generate_series``, into tables whose indexes are dropped for the
load and built after) with traces spread over 30 days, their retrieved contexts, one score and
one finished job per (trace, metric), then times the queries ``recalltrace`` runs, through
:class:`storage.history.History`, and drops the database.

    python -m benchmarks.history                 # 1,000,000 scores
    python -m benchmarks.history --scores 10000000 --keep   # keep the fill for the next run

Prints the median latency of each query and whether it meets the 100 ms target; ``scores
diagnose`` (every slice, missed reference and unsupported claim of a 7-day window) has its own
targets: under 1 s at a million scores, under 5 s at ten million.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from benchmarks._pg import scratch_database
from recalltrace.scorers.catalog import CATALOG
from recalltrace.storage.db import create_engine_from_url
from tests.support.factories import make_history

DATABASE = "rt_bench_history"
TARGET_MS = 100.0
DIAGNOSE_TARGET_MS = {1_000_000: 1000.0, 10_000_000: 5000.0}
DAYS = 30
APPS = ("support-bot", "docs-search", "billing-assistant")
# A typical mean per variant, so the data has some shape.
BASE_VALUE = {
    "llm_context_recall": 0.78,
    "non_llm_context_recall": 0.64,
    "id_based_context_recall": 0.71,
    "context_entity_recall": 0.82,
    "chunk_context_recall": 0.88,
    "judge_context_recall": 0.74,
    "pooled_context_recall": 0.69,
}


def _metrics_values() -> str:
    return ", ".join(
        f"('{key}', '{info.version}', {BASE_VALUE[key]})" for key, info in CATALOG.items()
    )


# Evidence shaped like each variant's ``details``, so rows are as wide as real ones.
_DETAILS = """
CASE m.metric
  WHEN 'llm_context_recall' THEN jsonb_build_object('mode', 'one_call', 'claims', jsonb_build_array(
    jsonb_build_object('statement', 'Password resets are sent by email within five minutes.',
                       'reason', 'Context 1 states the delay.', 'attributed', 1),
    jsonb_build_object('statement', 'The reset link expires after 24 hours.',
                       'reason', 'No context mentions the expiry.', 'attributed', 0),
    jsonb_build_object('statement', 'Admins can force a reset from the console.',
                       'reason', 'Context 3 describes the console.', 'attributed', 1)))
  WHEN 'non_llm_context_recall' THEN jsonb_build_object('measure', 'levenshtein',
    'threshold', 0.5, 'matches', jsonb_build_array(
      jsonb_build_object('reference_index', 0, 'found', true, 'retrieved_index', 1,
                         'similarity', 0.83),
      jsonb_build_object('reference_index', 1, 'found', false, 'retrieved_index', null,
                         'similarity', null)))
  WHEN 'id_based_context_recall' THEN jsonb_build_object(
    'found_ids', jsonb_build_array('doc_' || (s.g % 997), 'doc_' || (s.g % 991)),
    'missing_ids', jsonb_build_array('doc_' || (s.g % 983)))
  WHEN 'context_entity_recall' THEN jsonb_build_object(
    'reference_entities', jsonb_build_array('Acme Cloud', 'EU region', '24 hours', 'admin console'),
    'context_entities', jsonb_build_array('Acme Cloud', 'EU region', 'admin console'),
    'found_entities', jsonb_build_array('Acme Cloud', 'EU region', 'admin console'),
    'missing_entities', jsonb_build_array('24 hours'), 'reference_cache', false)
  WHEN 'chunk_context_recall' THEN jsonb_build_object('evaluated_chunks', jsonb_build_array(
      jsonb_build_object('id_chunk', 0, 'is_relevant', true, 'is_included', true,
                         'missing_info', null),
      jsonb_build_object('id_chunk', 1, 'is_relevant', true, 'is_included', false,
                         'missing_info', 'the 24 hour expiry of the link'),
      jsonb_build_object('id_chunk', 2, 'is_relevant', false, 'is_included', false,
                         'missing_info', null)),
    'missing_information', jsonb_build_array(jsonb_build_object('chunk_id', 1,
      'missing_info', 'the 24 hour expiry of the link')))
  ELSE jsonb_build_object('judge_reason',
    'The answer covers the main steps but omits the expiry of the reset link.')
END
"""


FILLED_TABLES = ("traces", "trace_tags", "retrieved_contexts", "scores", "scoring_jobs")
CACHES = ("summary_cache", "group_cache", "diagnose_cache", "cost_cache")


def _drop_indexes(conn: Any) -> list[str]:
    """Drop the filled tables' constraints and indexes; returns the statements that restore
    them. Loading into bare tables and building each index once after is several times faster
    than maintaining five indexes on ``scores`` row by row."""
    tables = {"tables": list(FILLED_TABLES)}
    constraints = conn.execute(
        text(
            """
            SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid), c.contype
            FROM pg_constraint c
            WHERE (c.conrelid::regclass::text = ANY(:tables) AND c.contype IN ('p', 'u', 'f'))
               OR (c.contype = 'f' AND c.confrelid::regclass::text = ANY(:tables))
            ORDER BY CASE c.contype WHEN 'p' THEN 0 WHEN 'u' THEN 1 ELSE 2 END
            """
        ),
        tables,
    ).all()
    indexes = conn.execute(
        text(
            """
            SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
            FROM pg_index i
            WHERE i.indrelid::regclass::text = ANY(:tables)
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
            """
        ),
        tables,
    ).all()
    for table, name, _definition, _kind in reversed(constraints):
        conn.execute(text(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"'))
    for name, _definition in indexes:
        conn.execute(text(f"DROP INDEX {name}"))
    return [
        *(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'
          for table, name, definition, kind in constraints if kind != "f"),
        *(definition for _name, definition in indexes),
        *(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'
          for table, name, definition, kind in constraints if kind == "f"),
    ]  # fmt: skip


def populate(engine: Engine, scores: int, now: datetime) -> int:
    """Fill the database server-side; returns the number of traces."""
    metrics = len(CATALOG)
    traces = -(-scores // metrics)
    params = {"n": traces, "now": now, "days": DAYS}
    with engine.begin() as conn:
        restore = _drop_indexes(conn)
        # Request attributes: the release changed 10 days ago, a tenth of the traffic is
        # staging, 4,096 users, one trace in eight tagged beta.
        conn.execute(
            text(
                """
                INSERT INTO traces (trace_id, app_name, service_name, started_at, duration_ms,
                    user_input, response, reference, reference_contexts, reference_context_ids,
                    metadata, error, notes, created_at, release, environment, user_id)
                SELECT t.trace_id, (ARRAY['support-bot', 'docs-search',
                        'billing-assistant'])[1 + t.g % 3], 'bench-service',
                    t.started_at, 40 + random() * 900,
                    'How do I reset the password of user ' || t.g || ' on the EU region?',
                    'Open the admin console, choose the user and press reset; the email '
                        || 'arrives within five minutes.',
                    'Password resets are sent by email within five minutes. The link expires '
                        || 'after 24 hours. Admins can force a reset from the console.',
                    jsonb_build_array('Password resets are sent by email.',
                                      'Reset links expire after 24 hours.'),
                    jsonb_build_array('doc_' || (t.g % 997), 'doc_' || (t.g % 983)),
                    '{"user_tier": "pro"}'::jsonb, false, '[]'::jsonb, :now,
                    CASE WHEN t.started_at > :now - interval '10 days' THEN '2.4.1'
                         ELSE '2.4.0' END,
                    CASE WHEN hashtext(t.trace_id) % 10 = 0 THEN 'staging'
                         ELSE 'production' END,
                    'user-' || (hashtext(t.trace_id) & 4095)
                FROM (
                    SELECT g, md5('trace-' || g) AS trace_id,
                        :now - random() * make_interval(days => :days) AS started_at
                    FROM generate_series(1, :n) AS g
                ) AS t
                """
            ),
            params,
        )
        conn.execute(
            text(
                "INSERT INTO trace_tags (trace_id, tag) SELECT trace_id, 'beta' FROM traces "
                "WHERE hashtext(trace_id) & 7 = 0"
            )
        )
        conn.execute(
            text(
                """
                INSERT INTO retrieved_contexts (trace_id, position, context_id, content, score,
                    metadata)
                SELECT t.trace_id, p, 'doc_' || ((hashtext(t.trace_id) & 1023) + p),
                    repeat('Resetting a password from the admin console sends an email. ', 5),
                    1.0 - p / 10.0, '{"source": "kb/reset.md"}'::jsonb
                FROM traces t CROSS JOIN generate_series(0, 3) AS p
                """
            )
        )
        conn.execute(
            text(
                f"""
                INSERT INTO scores (trace_id, metric, version, app_name, trace_started_at,
                    status, value, reason, details, model, prompt_tokens, completion_tokens,
                    cost_usd, latency_ms, scored_at, release, environment)
                SELECT s.trace_id, m.metric, m.version, s.app_name, s.started_at,
                    CASE WHEN s.r < 0.03 THEN 'failed' WHEN s.r < 0.10 THEN 'skipped'
                         ELSE 'scored' END,
                    CASE WHEN s.r >= 0.10 THEN round(greatest(0, least(1,
                        m.base + (s.x - 0.5) * 0.6))::numeric, 3)::float8 END,
                    CASE WHEN s.r < 0.03 THEN 'The judge gave no valid answer after 3 attempts.'
                         WHEN s.r < 0.10 THEN 'The trace has no reference to compare against.'
                         ELSE 'Two of three reference claims are supported by the retrieved '
                              || 'contexts.' END,
                    {_DETAILS},
                    'gpt-4o-mini', 1800 + (s.g % 900), 120 + (s.g % 80), 0.0004, 850 + s.x * 900,
                    s.started_at + interval '2 minutes', s.release, s.environment
                FROM (
                    SELECT t.trace_id, t.app_name, t.started_at, t.release, t.environment,
                        random() AS r, random() AS x, row_number() OVER () AS g
                    FROM traces t
                ) AS s
                CROSS JOIN (VALUES {_metrics_values()}) AS m(metric, version, base)
                """
            )
        )
        conn.execute(
            text(
                """
                INSERT INTO scoring_jobs (trace_id, metric, version, status, attempts, run_at,
                    last_error, created_at, updated_at)
                SELECT trace_id, metric, version,
                    CASE status WHEN 'scored' THEN 'done' ELSE status END,
                    CASE status WHEN 'failed' THEN 3 ELSE 1 END, scored_at,
                    CASE status WHEN 'failed' THEN reason END, trace_started_at, scored_at
                FROM scores
                """
            )
        )
        conn.execute(text("SET LOCAL maintenance_work_mem = '1GB'"))
        for statement in restore:
            conn.execute(text(statement))
        conn.execute(
            text("CREATE TABLE bench_fill (scores bigint, traces bigint, now timestamptz)")
        )
        conn.execute(
            text("INSERT INTO bench_fill VALUES (:scores, :n, :now)"), {**params, "scores": scores}
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return traces


def filled(engine: Engine, scores: int) -> tuple[int, datetime] | None:
    """The traces and fill time of a kept database holding ``scores`` scores, else None."""
    with engine.connect() as conn:
        if conn.execute(text("SELECT to_regclass('bench_fill')")).scalar_one() is None:
            return None
        row = conn.execute(text("SELECT scores, traces, now FROM bench_fill")).first()
    if row is None or row.scores != scores:
        return None
    return int(row.traces), row.now


METRIC = "llm_context_recall"
# Queries served from what the workers summarise in the background: their first run is shown.
CACHED = ("summary", "compare", "cost")


def compare(history: Any, by: str, since: datetime | None) -> Any:
    """``scores compare`` as the command runs it: sums from the database, then intervals."""
    from recalltrace.compare import compare_groups

    groups = history.group_summaries(metric=METRIC, by=by, since=since)
    return compare_groups(groups, order=list(groups)).groups


CANARY = "2.5.0-canary"


def add_canary(engine: Engine, now: datetime) -> None:
    """500 traces of a canary release (tagged ``canary``), scored by METRIC two days ago,
    written as the repository would: the caches of their hours dropped."""
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO traces (trace_id, app_name, service_name, started_at, duration_ms,
                    user_input, metadata, error, notes, created_at, release, environment)
                SELECT md5('canary-' || g), 'support-bot', 'bench-service',
                    :now - interval '2 days' + g * interval '1 minute', 100,
                    'Canary question ' || g, '{}'::jsonb, false, '[]'::jsonb, :now, :canary,
                    'production'
                FROM generate_series(1, 500) AS g
                """
            ),
            {"now": now, "canary": CANARY},
        )
        conn.execute(
            text(
                "INSERT INTO trace_tags (trace_id, tag) SELECT trace_id, 'canary' FROM traces "
                "WHERE release = :canary"
            ),
            {"canary": CANARY},
        )
        conn.execute(
            text(
                """
                INSERT INTO scores (trace_id, metric, version, app_name, trace_started_at,
                    status, value, reason, details, scored_at, release, environment)
                SELECT t.trace_id, :metric, :version, t.app_name, t.started_at, 'scored',
                    round(random()::numeric, 3)::float8, 'Canary.', '{}'::jsonb, :now,
                    t.release, t.environment
                FROM traces t WHERE t.release = :canary
                """
            ),
            {"metric": METRIC, "version": CATALOG[METRIC].version, "now": now, "canary": CANARY},
        )
        for table, column in (
            ("summary_cache", "bucket_start"),
            ("group_cache", "bucket_start"),
            ("diagnose_cache", "bucket_start"),
            ("cost_cache", "hour"),
        ):
            conn.execute(
                text(f"DELETE FROM {table} WHERE {column} >= :since"),
                {"since": now - timedelta(days=3)},
            )


def remove_canary(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM traces WHERE release = :canary"), {"canary": CANARY})
        for table in CACHES:
            conn.execute(text(f"DELETE FROM {table}"))


def _median_ms(run: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    result = run()  # warm the cache and the connection pool
    run()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), result


MISSED: list[str] = []
"""The queries that missed their target in this run (the run then exits 1)."""


def _verdict(name: str, ms: float, target: float) -> str:
    if ms < target:
        return "meets"
    MISSED.append(name)
    return "MISSES"


DIAGNOSED = ("id_based_context_recall", "non_llm_context_recall", "llm_context_recall")
"""The variants ``scores diagnose`` is timed for: each has its own section."""


def _diagnose_cases(history: Any, week: datetime, scores: int, repeat: int) -> None:
    """``scores diagnose`` of a 7-day window, per metric with its own section, after the
    workers' fill (the hourly rollups it reads are then stored but for the newest hour and
    the window's first, partial one)."""
    target = DIAGNOSE_TARGET_MS[min(DIAGNOSE_TARGET_MS, key=lambda n: abs(n - scores))]
    print(f"\nscores diagnose, 7 days: median of {repeat} runs (target {target:.0f} ms)")
    for metric in DIAGNOSED:
        ms, found = _median_ms(lambda m=metric: history.diagnose(metric=m, since=week), repeat)
        verdict = _verdict(f"diagnose --metric {metric}", ms, target)
        print(
            f"{'diagnose --metric ' + metric:<54} {'-':>8} {ms:>10.1f}  {found.scored:>7,} "
            f"scored, {found.tested} slices tested  {verdict}"
        )


def _cli_ms(args: list[str], url: str, repeat: int) -> float:
    """Median wall time of the installed command, interpreter start included."""
    command = [str(Path(sys.executable).with_name("recalltrace")), *args, "--database-url", url]
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", type=int, default=1_000_000, help="score rows to store")
    parser.add_argument("--repeat", type=int, default=21, help="timed runs per query")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the filled database after the run, and reuse one kept with the same "
        "--scores (its data then ends when it was filled, and the first-run figures read a "
        "cache earlier runs filled)",
    )
    args = parser.parse_args()

    with scratch_database(DATABASE, keep=args.keep) as url:
        engine = create_engine_from_url(url)
        now = datetime.now(timezone.utc).replace(microsecond=0)
        started = time.perf_counter()
        kept = filled(engine, args.scores) if args.keep else None
        if kept is None:
            with engine.begin() as conn:
                conn.execute(text("DROP TABLE IF EXISTS bench_fill"))
                for table in (*CACHES, *reversed(FILLED_TABLES)):
                    conn.execute(text(f"TRUNCATE {table} CASCADE"))
            traces = populate(engine, args.scores, now)
        else:
            traces, now = kept
            print(f"reusing the database kept from a run at {now:%Y-%m-%d %H:%M} UTC")
            with engine.begin() as conn:  # what an earlier run stored is not this run's
                for table in CACHES:
                    conn.execute(text(f"DELETE FROM {table}"))
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM scores")).scalar_one()
            trace_ids = list(
                conn.execute(text("SELECT trace_id FROM traces ORDER BY random() LIMIT 200"))
                .scalars()
                .all()
            )
        print(
            f"stored {stored:,} scores of {traces:,} traces over {DAYS} days "
            f"in {time.perf_counter() - started:.0f} s"
        )

        history = make_history(engine)
        began = time.perf_counter()
        held = history.warm_summaries()
        print(
            f"workers' background fill of ended buckets (summaries: 31 days by day, 48 hours by "
            f"hour, all apps, each app, the 5 latest releases and environments; compare, "
            f"diagnose and cost rollups: 31 days by hour, all apps), once on empty caches: "
            f"{time.perf_counter() - began:.1f} s "
            f"({held:,} rows stored or read); a pass with everything stored: "
            f"{_median_ms(history.warm_summaries, 3)[0]:.0f} ms"
        )
        week = now - timedelta(days=7)
        ids = iter(random.Random(7).choices(trace_ids, k=args.repeat + 2))
        cases: list[tuple[str, Callable[[], Any]]] = [
            (
                "summary --bucket day (last 7 days, every metric)",
                lambda: history.summary(bucket="day", since=week),
            ),
            (
                "summary --bucket day (all 30 days, every metric)",
                lambda: history.summary(bucket="day"),
            ),
            (
                "summary --bucket day --metric M (all 30 days)",
                lambda: history.summary(bucket="day", metric="llm_context_recall"),
            ),
            (
                "summary --bucket hour (last 24 hours, every metric)",
                lambda: history.summary(bucket="hour", since=now - timedelta(days=1)),
            ),
            (
                "worst --metric M --limit 10 (last 7 days)",
                lambda: history.worst(metric="llm_context_recall", limit=10, since=week),
            ),
            (
                "worst --metric M --app A --limit 10 (last 7 days)",
                lambda: history.worst(
                    metric="llm_context_recall", app="billing-assistant", limit=10, since=week
                ),
            ),
            (
                "worst --limit 10 (every metric, last 7 days)",
                lambda: history.worst(limit=10, since=week),
            ),
            ("trace show TRACE_ID", lambda: history.trace(next(ids))),
            (
                "check --metric M --since 1h",
                lambda: history.window(metric="llm_context_recall", since=now - timedelta(hours=1)),
            ),
            ("jobs list", lambda: history.problem_jobs()),
            (
                "compare --by release --metric M (all 30 days)",
                lambda: compare(history, "release", None),
            ),
            (
                "compare --by environment --metric M (last 7 days)",
                lambda: compare(history, "environment", week),
            ),
            ("compare --by tag --metric M (last 7 days)", lambda: compare(history, "tag", week)),
            (
                "summary --by release --metric M (all 30 days)",
                lambda: history.summary(bucket="day", metric=METRIC, by="release"),
            ),
            (
                "summary --where environment=staging (7 days)",
                lambda: history.summary(
                    bucket="day", since=week, where=[("environment", "staging")]
                ),
            ),
            (
                "summary --where release=2.4.1 --metric M (7 days)",
                lambda: history.summary(
                    bucket="day", since=week, metric=METRIC, where=[("release", "2.4.1")]
                ),
            ),
            (
                "worst --where tag=beta --metric M --limit 10 (7 days)",
                lambda: history.worst(metric=METRIC, limit=10, since=week, where=[("tag", "beta")]),
            ),
            (
                "worst --per-question --metric M --limit 10 (7 days)",
                lambda: history.worst(metric=METRIC, limit=10, since=week, per_question=True),
            ),
            ("cost (last 7 days)", lambda: history.cost(since=week)),
        ]
        print(f"\nmedian of {args.repeat} runs after 2 warm-up runs (target {TARGET_MS:.0f} ms)")
        print(
            "summaries, compare and cost also show their first run after the workers' fill (what "
            "a user's first\nquery pays), and, at the end, their first run on empty caches (no "
            "worker running)"
        )
        print(f"{'query':<54} {'first ms':>8} {'median ms':>10}  {'rows':>5}  target")
        for name, run in cases:
            first = "-"
            if name.startswith(CACHED):
                began = time.perf_counter()
                run()
                first = f"{(time.perf_counter() - began) * 1000:.1f}"
            ms, result = _median_ms(run, args.repeat)
            rows = len(result) if isinstance(result, list) else 1
            verdict = _verdict(name, ms, TARGET_MS)
            print(f"{name:<54} {first:>8} {ms:>10.1f}  {rows:>5}  {verdict}")
        _diagnose_cases(history, week, args.scores, min(args.repeat, 5))
        for command in (
            ["scores", "summary", "--format", "json"],
            ["scores", "summary", "--metric", METRIC, "--where", "release=2.4.1", "--format",
             "json"],
        ):  # fmt: skip
            cli = _cli_ms(command, url, 5)
            print(
                f"`recalltrace {' '.join(command)}` as a new process (a restart: interpreter "
                f"start included): median {cli:.0f} ms of 5 runs"
            )
        add_canary(engine, now)
        try:
            print("\nwith a canary release of 500 traces (tagged canary) two days ago:")
            history.warm_summaries()
            canary_cases: list[tuple[str, Callable[[], Any]]] = [
                (
                    "compare --by release --metric M (all 30 days)",
                    lambda: compare(history, "release", None),
                ),
                (
                    "compare --by tag --metric M (last 7 days)",
                    lambda: compare(history, "tag", week),
                ),
            ]
            for name, run in canary_cases:
                ms, result = _median_ms(run, args.repeat)
                verdict = _verdict(name, ms, TARGET_MS)
                print(f"{name:<54} {'-':>8} {ms:>10.1f}  {len(result):>5}  {verdict}")
        finally:
            remove_canary(engine)
        print("\nfirst run on empty caches (no worker has filled them; diagnose: every cache):")
        for name, run in cases:
            if name.startswith(CACHED):
                with engine.begin() as conn:
                    for table in ("summary_cache", "group_cache", "cost_cache"):
                        conn.execute(text(f"DELETE FROM {table}"))
                began = time.perf_counter()
                run()
                print(f"{name:<54} {(time.perf_counter() - began) * 1000:>8.1f}")
        for metric in DIAGNOSED:  # every hour of the week computed from the scores
            with engine.begin() as conn:
                for table in CACHES:
                    conn.execute(text(f"DELETE FROM {table}"))
            began = time.perf_counter()
            history.diagnose(metric=metric, since=week)
            name = f"diagnose --metric {metric} (7 days)"
            print(f"{name:<54} {(time.perf_counter() - began) * 1000:>8.1f}")
        engine.dispose()
    if MISSED:
        print(f"\nTARGET MISSED by {len(MISSED)} quer{'y' if len(MISSED) == 1 else 'ies'}: "
              + "; ".join(MISSED))  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
