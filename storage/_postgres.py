"""Every statement only Postgres runs, in one place.

The read caches (summaries, hourly rollups of groups and judge cost) are kept on Postgres only,
and so are the statements that read them fast there: one small lateral aggregate per bucket
(``percentile_cont`` has no SQLite counterpart), skip scans by recursive ``WITH``, the advisory
lock between score writers and cache fills, ``COPY`` for trace batches and ``pg_notify``.
:class:`~storage._dialect.PostgresDialect` and the cached read paths use these; nothing here
decides *whether* to run them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    TextClause,
    cast,
    func,
    literal_column,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by

SUMMARY_LOCK_KEY = 0x7265_6361_6C6C
"""Postgres advisory lock between score writers (shared) and cache fills (exclusive)."""

JIT_OFF = text("SET LOCAL jit = off")
"""Run before a cache aggregate: a plan this size crosses the default JIT threshold on big
tables, and compiling costs more than the query itself."""


def lock_shared() -> Any:
    """The shared side of :data:`SUMMARY_LOCK_KEY`, taken by every writer of scores."""
    return select(func.pg_advisory_xact_lock_shared(SUMMARY_LOCK_KEY))


def lock_exclusive() -> Any:
    """The exclusive side of :data:`SUMMARY_LOCK_KEY`, held by a cache fill."""
    return select(func.pg_advisory_xact_lock(SUMMARY_LOCK_KEY))


def notify(channel: str) -> Any:
    """Wake the workers listening on ``channel``."""
    return select(func.pg_notify(channel, ""))


def replaced_column() -> Any:
    """In an upsert's ``RETURNING``: whether the row replaced one (an updated row version
    carries the writing transaction in ``xmax``, an inserted one 0)."""
    return literal_column("xmax::text <> '0'").label("replaced")


def utc_day(column: Any) -> Any:
    """The UTC day holding the timestamp ``column``."""
    return func.date_trunc("day", func.timezone("UTC", column))


# -- JSON in aggregates (scores diagnose over the scores) ------------------------------------
def json_elements(column: Any, key: str) -> Any:
    """The elements of the JSON array ``column -> key`` as a table with a ``value`` column."""
    return func.jsonb_array_elements(column.op("->")(key)).table_valued("value")


def json_field(element: Any, key: str) -> Any:
    """``element ->> key``: a JSON object's field as text."""
    return element.op("->>")(key)


def json_text(element: Any) -> Any:
    """A JSON string element as text."""
    return element.op("#>>")(literal_column("'{}'"))


def json_is(field: Any, value: bool | int) -> Any:
    """Whether the text of a JSON field (:func:`json_field`) is the JSON ``value``."""
    return field == json.dumps(value)


def json_item(column: Any, index: Any) -> Any:
    """``column ->> index``: the text of the JSON array ``column``'s item at ``index``."""
    return column.op("->>")(cast(index, Integer))


def json_scalar_pairs(column: Any) -> tuple[Any, Any]:
    """The (key, value) pairs of the JSON object ``column`` as a table, and the condition
    keeping the scalar values (strings, numbers, booleans)."""
    pairs = func.jsonb_each_text(column).table_valued("key", "value")
    scalar = func.jsonb_typeof(column.op("->")(pairs.c.key)).in_(("string", "number", "boolean"))
    return pairs, scalar


def recent_first(trace_id: Any, started: Any, when: Any, count: int) -> Any:
    """The aggregate of the ``count`` most recent trace ids among the rows where ``when``
    holds (one pass, no second scan)."""
    ordered = func.array_agg(aggregate_order_by(trace_id, started.desc(), trace_id)).filter(when)
    return type_coerce(ordered, ARRAY(String))[1:count]


INVALIDATE = text(
    """
    WITH summaries AS (
        DELETE FROM summary_cache
        WHERE (bucket, bucket_start, metric) IN (
            SELECT * FROM unnest(CAST(:buckets AS text[]), CAST(:starts AS timestamptz[]),
                                 CAST(:metrics AS text[])))
    ), groups AS (
        DELETE FROM group_cache
        WHERE (metric, bucket_start) IN (
            SELECT * FROM unnest(CAST(:hour_metrics AS text[]), CAST(:hours AS timestamptz[])))
    ), diagnoses AS (
        DELETE FROM diagnose_cache
        WHERE (metric, bucket_start) IN (
            SELECT * FROM unnest(CAST(:hour_metrics AS text[]), CAST(:hours AS timestamptz[])))
    )
    DELETE FROM cost_cache WHERE hour = ANY(CAST(:scored_hours AS timestamptz[]))
    """
)
"""Drop the summaries of (bucket, start, metric), the group and diagnose sums of (metric, hour)
and the cost rows of scoring hours, in one round trip."""


def distinct_values(table: str, column: str) -> str:
    """A recursive ``WITH`` naming ``v(val)``, the distinct values of ``column`` in ``table`` in
    order (a last ``NULL`` ends it), for a query to follow. One probe of an index led by
    ``column`` per value (a skip scan), where ``DISTINCT`` reads every row."""
    return f"""
        WITH RECURSIVE v(val) AS (
            (SELECT {column} FROM {table} WHERE {column} IS NOT NULL ORDER BY {column} LIMIT 1)
            UNION ALL
            SELECT (SELECT {column} FROM {table} WHERE {column} > v.val
                    ORDER BY {column} LIMIT 1)
            FROM v WHERE v.val IS NOT NULL
        )"""


def values_in_window(
    table: str, column: str, started: str, since: bool, until: bool
) -> tuple[TextClause, TextClause]:
    """The distinct values of ``column`` in ``table`` among rows whose ``started`` lies in the
    window (``:since``/``:until`` when given), at most ``:most`` (a skip scan of the
    (attribute, start) index, one probe per value); and whether some row there lacks one."""
    window = ""
    if since:
        window += f" AND w.{started} >= :since"
    if until:
        window += f" AND w.{started} < :until"
    values = text(
        distinct_values(table, column)
        + f"""
        SELECT val FROM v
        WHERE val IS NOT NULL
          AND EXISTS (SELECT 1 FROM {table} AS w WHERE w.{column} = v.val {window})
        LIMIT :most
        """
    )
    missing = text(f"SELECT EXISTS (SELECT 1 FROM {table} AS w WHERE w.{column} IS NULL{window})")
    return values, missing


def count_distinct_upto(table: str, column: str) -> TextClause:
    """How many distinct values ``column`` has in ``table``, counted up to ``:most``."""
    return text(
        distinct_values(table, column)
        + " SELECT count(*) FROM (SELECT val FROM v WHERE val IS NOT NULL LIMIT :most) AS f"
    )


def summary_sql(
    *, with_app: bool, attributes: Sequence[str] = (), missing: Sequence[str] = ()
) -> TextClause:
    """The summary of chosen (bucket, metric) pairs: one small aggregate each.

    Each lateral aggregate is an index-only range scan of ``ix_scores_metric_version_started``, so
    the only sorts are the small per-bucket ones ``percentile_cont`` needs anyway. A plain
    ``GROUP BY`` first sorts every row of the window by its group (three times slower for a
    week of scores), and ``date_trunc(..., 'UTC')`` adds a time-zone lookup per row. Buckets
    are fixed steps from a UTC-truncated start, the same boundaries ``date_trunc(..., 'UTC')``
    gives.
    """
    app_filter = "AND sc.app_name = :app" if with_app else ""
    # Release and environment are on the score rows (and in the covering index): filtering
    # by them keeps the scan index-only. Only these two names reach here (see Selection.scope).
    for name in attributes:
        app_filter += f" AND sc.{name} = :attr_{name}"
    for name in missing:
        app_filter += f" AND sc.{name} IS NULL"
    # ``value`` is NULL unless the status is 'scored' (the result contract), and these
    # aggregates skip NULLs, so they need no FILTER: evaluating one per row per aggregate
    # costs a third of the query. One array-valued percentile_cont sorts each bucket once.
    return text(
        f"""
        SELECT p.bucket_start, p.metric, s.n_scored, s.mean, s.percentiles,
               s.n_skipped, s.n_failed
        FROM unnest(
                 CAST(:starts AS timestamptz[]),
                 CAST(:metrics AS text[]),
                 CAST(:versions AS text[])
             ) AS p(bucket_start, metric, version)
        CROSS JOIN LATERAL (
            SELECT count(sc.value) AS n_scored,
                   avg(sc.value) AS mean,
                   percentile_cont(CAST(:fractions AS float8[]))
                       WITHIN GROUP (ORDER BY sc.value) AS percentiles,
                   count(*) FILTER (WHERE sc.status = 'skipped') AS n_skipped,
                   count(*) FILTER (WHERE sc.status = 'failed') AS n_failed
            FROM scores AS sc
            WHERE sc.metric = p.metric
              AND sc.version = p.version
              AND sc.trace_started_at >= p.bucket_start
              AND sc.trace_started_at < p.bucket_start + CAST(:step AS interval)
              AND sc.trace_started_at >= :lower
              AND sc.trace_started_at < :upper
              {app_filter}
        ) AS s
        """
    )


def group_sql(by: str, attributes: Sequence[str], with_app: bool) -> TextClause:
    """Each group's count, sum, sum of squares, non-0/1 count and first start per hour of
    ``:starts`` (``by``: release, environment or tag)."""
    if by == "tag":
        source = "scores AS sc LEFT JOIN trace_tags AS tt ON tt.trace_id = sc.trace_id"
        column = "tt.tag"
    elif by in ("release", "environment"):
        source, column = "scores AS sc", f"sc.{by}"
    else:
        raise ValueError(f"no rollup by {by!r}")
    filters = " AND sc.app_name = :app" if with_app else ""
    for name in attributes:  # only release and environment reach here
        filters += f" AND sc.{name} = :attr_{name}"
    return text(
        f"""
        SELECT p.bucket_start, g.grp, g.n, g.total, g.total_sq, g.fractional, g.first_started
        FROM unnest(CAST(:starts AS timestamptz[])) AS p(bucket_start)
        CROSS JOIN LATERAL (
            SELECT {column} AS grp, count(*) AS n, sum(sc.value) AS total,
                   sum(sc.value * sc.value) AS total_sq,
                   count(*) FILTER (WHERE sc.value <> 0 AND sc.value <> 1) AS fractional,
                   min(sc.trace_started_at) AS first_started
            FROM {source}
            WHERE sc.metric = :metric AND sc.version = :version AND sc.status = 'scored'
              AND sc.trace_started_at >= p.bucket_start
              AND sc.trace_started_at < p.bucket_start + interval '1 hour'
              AND sc.trace_started_at >= :lower AND sc.trace_started_at < :upper
              {filters}
            GROUP BY 1
        ) AS g
        """
    )


def cost_sql(with_app: bool, with_metric: bool, attributes: Sequence[str]) -> TextClause:
    """Judge spend per variant and model in each scoring hour of ``:starts``."""
    filters = (" AND sc.app_name = :app" if with_app else "") + (
        " AND sc.metric = :metric" if with_metric else ""
    )
    for name in attributes:  # only release and environment reach here
        filters += f" AND sc.{name} = :attr_{name}"
    return text(
        f"""
        SELECT p.hour, c.metric, c.model, c.n, c.prompt, c.completion, c.cost, c.unpriced
        FROM unnest(CAST(:starts AS timestamptz[])) AS p(hour)
        CROSS JOIN LATERAL (
            SELECT sc.metric, sc.model, count(*) AS n,
                   coalesce(sum(sc.prompt_tokens), 0) AS prompt,
                   coalesce(sum(sc.completion_tokens), 0) AS completion,
                   sum(sc.cost_usd) AS cost,
                   count(*) FILTER (WHERE sc.cost_usd IS NULL) AS unpriced
            FROM scores AS sc
            WHERE sc.scored_at >= p.hour AND sc.scored_at < p.hour + interval '1 hour'
              AND sc.scored_at >= :lower AND sc.scored_at < :upper
              AND sc.model IS NOT NULL {filters}
            GROUP BY sc.metric, sc.model
        ) AS c
        """
    )


# -- COPY of a trace batch (binary; the column types in order) -------------------------------
COPY_TRACES = (
    "COPY traces (trace_id, app_name, service_name, started_at, duration_ms,"
    " user_input, response, reference, reference_contexts,"
    " reference_context_ids, metadata, error, notes, created_at,"
    " otel_trace_id, otel_span_id, release, environment, user_id, session_id,"
    " tags)"
    " FROM STDIN (FORMAT BINARY)"
)
COPY_CONTEXTS = (
    "COPY retrieved_contexts (trace_id, position, context_id, content, score,"
    " metadata) FROM STDIN (FORMAT BINARY)"
)
COPY_TAGS = "COPY trace_tags (trace_id, tag) FROM STDIN"
COPY_JOBS = (
    "COPY scoring_jobs (trace_id, metric, version, status, attempts, run_at,"
    " expires_at, created_at, updated_at) FROM STDIN (FORMAT BINARY)"
)
# Column types of the binary COPY statements above, in column order.
TRACE_COPY_TYPES = [
    "varchar", "varchar", "varchar", "timestamptz", "float8", "text", "text", "text",
    "jsonb", "jsonb", "jsonb", "bool", "jsonb", "timestamptz", "varchar", "varchar",
    "varchar", "varchar", "varchar", "varchar", "jsonb",
]  # fmt: skip
CONTEXT_COPY_TYPES = ["varchar", "int4", "varchar", "text", "float8", "jsonb"]
JOB_COPY_TYPES = [
    "varchar", "varchar", "varchar", "varchar", "int4",
    "timestamptz", "timestamptz", "timestamptz", "timestamptz",
]  # fmt: skip
NOTIFY_RAW = "SELECT pg_notify(%s, '')"
"""``pg_notify`` on a raw psycopg cursor (inside a COPY batch)."""


# -- scores diagnose: per-hour sums (storage.diagnose_rollups) --------------------------------
_DIAGNOSE_FIELDS = (
    "section", "key", "value", "label", "n", "total", "total_sq", "example_ids", "example_keys",
)  # fmt: skip
DIAGNOSE_COLUMNS = ", ".join(_DIAGNOSE_FIELDS)
"""The columns of a per-hour diagnose row (after ``bucket_start``), as ``diagnose_cache``
stores them."""


def _diagnose_hour(attributes: Sequence[str], with_app: bool) -> str:
    """The conditions on ``scores AS sc`` of one hour ``p.bucket_start`` of a diagnosis: the
    variant's scored results in the window, of the app and release/environment filters."""
    filters = " AND sc.app_name = :app" if with_app else ""
    for name in attributes:  # only release and environment reach here (Selection.scope)
        filters += f" AND sc.{name} = :attr_{name}"
    return f"""sc.metric = :metric AND sc.version = :version AND sc.status = 'scored'
              AND sc.trace_started_at >= p.bucket_start
              AND sc.trace_started_at < p.bucket_start + interval '1 hour'
              AND sc.trace_started_at >= :lower AND sc.trace_started_at < :upper
              {filters}"""


def _per_hour(select_list: str, lateral: str) -> str:
    """Rows of :data:`DIAGNOSE_COLUMNS` (after ``bucket_start``) per hour ``p.bucket_start`` of
    ``:starts``: ``select_list`` over the lateral aggregate ``g``."""
    return f"""
        SELECT * FROM (
            SELECT p.bucket_start, {select_list}
            FROM unnest(CAST(:starts AS timestamptz[])) AS p(bucket_start)
            CROSS JOIN LATERAL ({lateral}) AS g
        ) AS x(bucket_start, {DIAGNOSE_COLUMNS})"""


# Sort keys of example traces (ascending): recent first for references and claims (minus the
# start in seconds: a double keeps microseconds apart at today's epoch), lowest score first for
# documents.
_RECENT_KEY = "-CAST(extract(epoch FROM h.started) AS float8)"


def diagnose_slices_sql(attributes: Sequence[str], with_app: bool, max_chars: int) -> str:
    """Per hour of ``:starts``: the scored count, sum and sum of squares of every value of the
    request attributes kept per trace (``app``, ``service``, ``user_id``, ``session_id``; NULL
    for the traces without one), and of every scalar value (at most ``max_chars`` long) of the
    retrieved documents' metadata (``document.KEY``; a trace counted once per value, with its
    three lowest-scoring traces). Rows as :data:`DIAGNOSE_COLUMNS`."""
    hour = _diagnose_hour(attributes, with_app)
    requests = _per_hour(
        "'slice', g.key, g.value, CAST(NULL AS text), g.n, CAST(g.total AS float8), "
        "CAST(g.total_sq AS float8), CAST(NULL AS text[]), CAST(NULL AS float8[])",
        f"""
            SELECT a.key, a.value, count(*) AS n, sum(s.value) AS total,
                   sum(s.value * s.value) AS total_sq
            FROM (SELECT sc.value, sc.app_name, t.service_name, t.user_id, t.session_id
                  FROM scores AS sc JOIN traces AS t ON t.trace_id = sc.trace_id
                  WHERE {hour}) AS s
            CROSS JOIN LATERAL (VALUES ('app', CAST(s.app_name AS text)),
                                       ('service', CAST(s.service_name AS text)),
                                       ('user_id', CAST(s.user_id AS text)),
                                       ('session_id', CAST(s.session_id AS text))) AS a(key, value)
            GROUP BY a.key, a.value""",
    )
    documents = _per_hour(
        "'slice', g.key, g.value, CAST(NULL AS text), g.n, CAST(g.total AS float8), "
        "CAST(g.total_sq AS float8), g.example_ids, g.example_keys",
        f"""
            SELECT 'document.' || d.k AS key, CAST(d.v AS text) AS value, count(*) AS n,
                   sum(d.score) AS total, sum(d.score * d.score) AS total_sq,
                   (array_agg(CAST(d.trace_id AS text) ORDER BY d.score, d.trace_id))[1:3]
                       AS example_ids,
                   (array_agg(d.score ORDER BY d.score, d.trace_id))[1:3] AS example_keys
            FROM (SELECT DISTINCT sc.trace_id, sc.value AS score, kv.key AS k,
                         CAST(kv.value AS VARCHAR(500)) AS v
                  FROM scores AS sc
                  -- per result, by the contexts' trace index (OFFSET 0 keeps it so): the
                  -- planner cannot tell how few results an hour holds, and would hash every
                  -- retrieved context stored
                  CROSS JOIN LATERAL (SELECT c.metadata FROM retrieved_contexts AS c
                                      WHERE c.trace_id = sc.trace_id OFFSET 0) AS rc
                  CROSS JOIN LATERAL jsonb_each_text(rc.metadata) AS kv
                  WHERE {hour}
                    AND jsonb_typeof(rc.metadata -> kv.key) IN ('string', 'number', 'boolean')
                    AND length(CAST(kv.value AS VARCHAR(500))) <= {int(max_chars)}) AS d
            GROUP BY d.k, d.v""",
    )
    return f"{requests}\n        UNION ALL{documents}"


def diagnose_references_sql(kind: str, attributes: Sequence[str], with_app: bool) -> str:
    """Per hour of ``:starts`` and reference (``kind`` ``id``: the document ids of the
    evidence's ``found_ids`` and ``missing_ids``; ``context``: the reference contexts of the
    evidence's ``matches``): how many scored requests needed it, how many retrieved it, and the
    three most recent that did not. Rows as :data:`DIAGNOSE_COLUMNS`."""
    hour = _diagnose_hour(attributes, with_app)
    if kind == "id":
        found = "coalesce(sc.details -> 'found_ids', '[]'::jsonb)"
        hits = f"""
            SELECT e.value AS ref, sc.trace_id, sc.trace_started_at AS started,
                   CASE WHEN e.ordinality <= jsonb_array_length({found}) THEN 1 ELSE 0 END
                       AS hit
            FROM scores AS sc
            CROSS JOIN LATERAL jsonb_array_elements_text(
                {found} || coalesce(sc.details -> 'missing_ids', '[]'::jsonb))
                WITH ORDINALITY AS e(value, ordinality)
            WHERE {hour}"""
    elif kind == "context":
        hits = f"""
            SELECT t.reference_contexts ->> CAST(e.value ->> 'reference_index' AS INTEGER)
                       AS ref,
                   sc.trace_id, sc.trace_started_at AS started,
                   CASE WHEN e.value ->> 'found' = 'true' THEN 1 ELSE 0 END AS hit
            FROM scores AS sc JOIN traces AS t ON t.trace_id = sc.trace_id
            CROSS JOIN LATERAL jsonb_array_elements(sc.details -> 'matches') AS e(value)
            WHERE {hour}"""
    else:
        raise ValueError(f"no references of kind {kind!r}")
    return _per_hour(
        f"'reference', '{kind}', CAST(g.ref AS text), CAST(NULL AS text), g.n, "
        "CAST(g.k AS float8), CAST(0 AS float8), "
        "g.example_ids, g.example_keys",
        f"""
            SELECT h.ref, count(*) AS n, sum(h.hit) AS k,
                   (array_agg(CAST(h.trace_id AS text) ORDER BY h.started DESC, h.trace_id)
                       FILTER (WHERE h.hit = 0))[1:3] AS example_ids,
                   (array_agg({_RECENT_KEY} ORDER BY h.started DESC, h.trace_id)
                       FILTER (WHERE h.hit = 0))[1:3] AS example_keys
            FROM ({hits}) AS h
            WHERE h.ref IS NOT NULL
            GROUP BY h.ref""",
    )


def diagnose_claims_sql(attributes: Sequence[str], with_app: bool) -> str:
    """Per hour of ``:starts`` and claim of the evidence's ``claims`` (grouped ignoring case
    and surrounding space): its first statement, how often it was judged and not supported,
    and the three most recent traces where it was not. Rows as :data:`DIAGNOSE_COLUMNS`."""
    hour = _diagnose_hour(attributes, with_app)
    return _per_hour(
        "'claim', '', g.claim, g.label, g.n, CAST(g.k AS float8), CAST(0 AS float8), "
        "g.example_ids, g.example_keys",
        f"""
            SELECT h.claim, min(h.statement) AS label, count(*) AS n, sum(h.miss) AS k,
                   (array_agg(CAST(h.trace_id AS text) ORDER BY h.started DESC, h.trace_id)
                       FILTER (WHERE h.miss = 1))[1:3] AS example_ids,
                   (array_agg({_RECENT_KEY} ORDER BY h.started DESC, h.trace_id)
                       FILTER (WHERE h.miss = 1))[1:3] AS example_keys
            FROM (SELECT lower(trim(e.value ->> 'statement')) AS claim,
                         e.value ->> 'statement' AS statement,
                         CASE WHEN e.value ->> 'attributed' IN ('0') THEN 1 ELSE 0 END AS miss,
                         sc.trace_id, sc.trace_started_at AS started
                  FROM scores AS sc
                  CROSS JOIN LATERAL jsonb_array_elements(sc.details -> 'claims') AS e(value)
                  WHERE {hour}) AS h
            WHERE h.claim IS NOT NULL
            GROUP BY h.claim""",
    )


def diagnose_fill_slices_sql(max_chars: int) -> str:
    """:func:`diagnose_slices_sql` for whole hours of ``:starts``, every variant of
    ``:metrics``/``:versions`` at once, all apps: one pass over each hour's traces, whose
    attributes and documents' metadata are read once for all their variants' results. Rows:
    ``bucket_start, metric, version``, then :data:`DIAGNOSE_COLUMNS`."""
    scored = """sc.trace_id = t.trace_id AND sc.status = 'scored'
                AND (sc.metric, sc.version) IN (
                    SELECT * FROM unnest(CAST(:metrics AS text[]), CAST(:versions AS text[])))
                AND sc.trace_started_at >= p.bucket_start
                AND sc.trace_started_at < p.bucket_start + interval '1 hour'"""
    hour = "t.started_at >= p.bucket_start AND t.started_at < p.bucket_start + interval '1 hour'"
    requests = f"""
            SELECT sc.metric, sc.version, a.key, a.value, count(*) AS n,
                   sum(sc.value) AS total, sum(sc.value * sc.value) AS total_sq,
                   CAST(NULL AS text[]) AS example_ids, CAST(NULL AS float8[]) AS example_keys
            FROM traces AS t JOIN scores AS sc ON {scored}
            CROSS JOIN LATERAL (VALUES ('app', CAST(sc.app_name AS text)),
                                       ('service', CAST(t.service_name AS text)),
                                       ('user_id', CAST(t.user_id AS text)),
                                       ('session_id', CAST(t.session_id AS text))) AS a(key, value)
            WHERE {hour}
            GROUP BY sc.metric, sc.version, a.key, a.value"""
    documents = f"""
            SELECT sc.metric, sc.version, 'document.' || t.k AS key, CAST(t.v AS text) AS value,
                   count(*) AS n, sum(sc.value) AS total, sum(sc.value * sc.value) AS total_sq,
                   (array_agg(CAST(t.trace_id AS text) ORDER BY sc.value, t.trace_id))[1:3]
                       AS example_ids,
                   (array_agg(sc.value ORDER BY sc.value, t.trace_id))[1:3] AS example_keys
            FROM (
                -- each trace's pairs once (OFFSET 0 keeps the planner from reading them again
                -- for each of the trace's results)
                SELECT t.trace_id, d.k, d.v
                FROM traces AS t
                CROSS JOIN LATERAL (
                    SELECT DISTINCT kv.key AS k, CAST(kv.value AS VARCHAR(500)) AS v
                    FROM retrieved_contexts AS c
                    CROSS JOIN LATERAL jsonb_each_text(c.metadata) AS kv
                    WHERE c.trace_id = t.trace_id
                      AND jsonb_typeof(c.metadata -> kv.key) IN ('string', 'number', 'boolean')
                      AND length(CAST(kv.value AS VARCHAR(500))) <= {int(max_chars)}) AS d
                WHERE {hour}
                OFFSET 0
            ) AS t
            JOIN scores AS sc ON {scored}
            GROUP BY sc.metric, sc.version, t.k, t.v"""
    return f"""
        SELECT p.bucket_start, g.metric, g.version, 'slice', g.key, g.value, CAST(NULL AS text),
               g.n, CAST(g.total AS float8), CAST(g.total_sq AS float8), g.example_ids,
               g.example_keys
        FROM unnest(CAST(:starts AS timestamptz[])) AS p(bucket_start)
        CROSS JOIN LATERAL ({requests}
            UNION ALL{documents}
        ) AS g"""


def diagnose_of_variant(hours_sql: str) -> str:
    """The rows of a one-variant statement (over ``:metric``, ``:version``) with the variant:
    ``bucket_start, metric, version``, then :data:`DIAGNOSE_COLUMNS`."""
    fields = ", ".join(f"x.{name}" for name in _DIAGNOSE_FIELDS)
    return f"""
        SELECT x.bucket_start, CAST(:metric AS text), CAST(:version AS text), {fields}
        FROM ({hours_sql}) AS x"""


def diagnose_store_sql(rows_sql: str, max_values: int) -> TextClause:
    """Store the rows of ``rows_sql`` (``bucket_start, metric, version``, then
    :data:`DIAGNOSE_COLUMNS`) in ``diagnose_cache`` under ``:scope``: a slice attribute with
    more than ``max_values`` values in an hour is stored as one ``overflow`` row instead of its
    values. Run under the fill lock, after deleting what those hours held."""
    return text(
        f"""
        WITH computed AS ({rows_sql}
        ), counted AS (
            SELECT c.*, count(*) OVER (
                       PARTITION BY c.bucket_start, c.metric, c.version, c.section, c.key
                   ) AS values
            FROM computed AS c (bucket_start, metric, version, {DIAGNOSE_COLUMNS})
        ), kept AS (
            SELECT bucket_start, metric, version, {DIAGNOSE_COLUMNS} FROM counted
            WHERE section <> 'slice' OR values <= {int(max_values)}
            UNION ALL
            SELECT DISTINCT bucket_start, metric, version, 'overflow', key, CAST(NULL AS text),
                   CAST(NULL AS text), values, CAST(0 AS float8), CAST(0 AS float8),
                   CAST(NULL AS text[]), CAST(NULL AS float8[])
            FROM counted WHERE section = 'slice' AND values > {int(max_values)}
        )
        INSERT INTO diagnose_cache (bucket_start, metric, version, scope, {DIAGNOSE_COLUMNS},
                                    computed_at)
        SELECT bucket_start, metric, version, :scope, {DIAGNOSE_COLUMNS}, now() FROM kept
        """
    )


DIAGNOSE_STORED_HOURS = text(
    f"""
    INSERT INTO diagnose_cache (bucket_start, metric, version, scope, {DIAGNOSE_COLUMNS},
                                computed_at)
    SELECT h, v.metric, v.version, :scope, 'hour', '', NULL, NULL, 0, 0, 0, NULL, NULL, now()
    FROM unnest(CAST(:starts AS timestamptz[])) AS h
    CROSS JOIN unnest(CAST(:metrics AS text[]), CAST(:versions AS text[])) AS v(metric, version)
    """
)
"""Mark the hours ``:starts`` of every variant of ``:metrics``/``:versions`` stored."""

DIAGNOSE_EMPTY_HOURS = text(
    """
    SELECT h, m FROM unnest(CAST(:starts AS timestamptz[])) AS h
    CROSS JOIN unnest(CAST(:metrics AS text[])) AS m
    WHERE NOT EXISTS (
        SELECT 1 FROM scores AS s
        WHERE s.metric = m AND s.trace_started_at >= h
          AND s.trace_started_at < h + interval '1 hour'
    )
    """
)
"""The (hour, metric) pairs of ``:starts`` x ``:metrics`` without a single score: one index
probe each."""


def _diagnose_merged(hours_sql: str, section: str) -> str:
    """A ``WITH`` naming ``merged``: the rows of ``section`` (and the ``overflow`` marks) of
    the stored hours ``:cached`` (from ``diagnose_cache``) and of the hours ``:starts``
    computed now by ``hours_sql``, for a query to follow that sums them per key."""
    return f"""
        WITH live AS ({hours_sql}
        ), merged AS (
            SELECT {DIAGNOSE_COLUMNS} FROM live
            UNION ALL
            SELECT {DIAGNOSE_COLUMNS} FROM diagnose_cache AS c
            WHERE c.metric = :metric AND c.version = :version AND c.scope = :scope
              AND c.section IN ('{section}', 'overflow')
              AND c.bucket_start = ANY(CAST(:cached AS timestamptz[]))
        )"""


def _merged_examples(keys: str) -> str:
    """``(key, value, ids)``: the first three example traces of each ``(key, value)`` of
    ``keys`` among the ``merged`` rows, in the order of their sort keys across hours."""
    return f"""
        SELECT r.key, r.value, (array_agg(e.id ORDER BY e.sort, e.id))[1:3] AS ids
        FROM merged AS r
        JOIN {keys} AS w ON w.key = r.key AND w.value = r.value
        CROSS JOIN LATERAL unnest(r.example_ids, r.example_keys) AS e(id, sort)
        GROUP BY r.key, r.value"""


_DOCUMENT_SUMS = "(SELECT key, value FROM sums WHERE key LIKE 'document.%')"


def diagnose_slices_merge(hours_sql: str) -> TextClause:
    """The window's slices: per (attribute, value) the count, sum and sum of squares (and for
    documents the three lowest-scoring traces), ``overflow`` true on one row per attribute
    some stored hour held too many values of (its sums are then incomplete)."""
    return text(
        _diagnose_merged(hours_sql, "slice")
        + f""", sums AS (
            SELECT key, value, sum(n) AS n, sum(total) AS total, sum(total_sq) AS total_sq
            FROM merged WHERE section = 'slice' GROUP BY key, value
        ), examples AS ({_merged_examples(_DOCUMENT_SUMS)}
        )
        SELECT s.key, s.value, s.n, s.total, s.total_sq, x.ids, false AS overflow
        FROM sums AS s LEFT JOIN examples AS x ON x.key = s.key AND x.value = s.value
        UNION ALL
        SELECT DISTINCT key, CAST(NULL AS text), 0, 0, 0, CAST(NULL AS text[]), true
        FROM merged WHERE section = 'overflow'
        """
    )


def diagnose_references_merge(hours_sql: str) -> TextClause:
    """The window's references missed at least once: how many requests needed each, how many
    retrieved it, and for the ``:limit`` most missed the three most recent requests that did
    not."""
    return text(
        _diagnose_merged(hours_sql, "reference")
        + f""", sums AS (
            SELECT key, value, sum(n) AS n, sum(total) AS k
            FROM merged WHERE section = 'reference'
            GROUP BY key, value HAVING sum(n) > sum(total)
        ), shown AS (
            SELECT key, value FROM sums
            ORDER BY n - k DESC, n DESC, value COLLATE "C" LIMIT :limit
        ), examples AS ({_merged_examples("shown")}
        )
        SELECT s.value, s.n, s.k, x.ids
        FROM sums AS s LEFT JOIN examples AS x ON x.key = s.key AND x.value = s.value
        """
    )


def diagnose_claims_merge(hours_sql: str) -> TextClause:
    """The window's ``:limit`` claims most often unsupported (as the scores' own query ranks
    them): the claim, its first statement, unsupported and judged counts, and the three most
    recent traces where it was not supported."""
    return text(
        _diagnose_merged(hours_sql, "claim")
        + f""", sums AS (
            SELECT key, value, min(label) AS label, sum(total) AS k, sum(n) AS n
            FROM merged WHERE section = 'claim'
            GROUP BY key, value HAVING sum(total) > 0
            ORDER BY sum(total) DESC, sum(n) DESC, value LIMIT :limit
        ), examples AS ({_merged_examples("sums")}
        )
        SELECT s.value, s.label, s.k, s.n, x.ids
        FROM sums AS s LEFT JOIN examples AS x ON x.key = s.key AND x.value = s.value
        ORDER BY s.k DESC, s.n DESC, s.value
        """
    )
