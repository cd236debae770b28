"""Traffic with planted causes for ``scores diagnose``, scored by the real id-based scorer.

Each request needs two documents of a pool, retrieves four contexts (metadata ``source`` and
``index``) and carries a release, an environment, tags and a user. Planted, when asked:

- a stale slice: requests tagged ``legacy`` (15%) retrieve what they need far less often;
- a stale document index: requests whose documents come from index ``v1-stale`` (15%) too;
- ``kb-never``: needed by 20% of requests, never retrieved;
- ``kb-always``: needed by 30% of requests, always retrieved;
- for ``llm_context_recall``: the claim "The warranty lasts two years." of one reference is
  unsupported nine times in ten, every other claim once in ten.

Without causes every attribute is drawn independently of what is retrieved, so any slice named
is a false discovery.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

from recalltrace.scorers import ScoreResult
from recalltrace.scorers.variants.id_based_context_recall import IDBasedContextRecall
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.storage.repository import Repository
from tests.support.factories import make_trace

ID_METRIC = "id_based_context_recall"
LLM_METRIC = "llm_context_recall"
POOL = [f"kb-{i:02d}" for i in range(1, 21)]
WARRANTY = "The warranty lasts two years."
REFERENCES = {
    "warranty": f"{WARRANTY} Repairs are free during the warranty.",
    "shipping": "Orders ship within two days. Shipping is free above 50 euros.",
    "returns": "Returns are accepted for 30 days. Refunds arrive within a week.",
}


def traffic(
    rng: random.Random,
    count: int,
    *,
    app: str,
    planted: bool,
    start: datetime | None = None,
) -> list[TraceRecord]:
    """``count`` requests of ``app`` in the hour before ``start`` (default: now)."""
    start = start or datetime.now(timezone.utc) - timedelta(minutes=5)
    records = []
    for index in range(count):
        legacy = rng.random() < 0.15
        stale = rng.random() < 0.15
        needed = rng.sample(POOL, 2)
        if planted and rng.random() < 0.2:
            needed.append("kb-never")
        if planted and rng.random() < 0.3:
            needed.append("kb-always")
        hit_rate = 0.8
        if planted and (legacy or stale):
            hit_rate = 0.25
        retrieved = [
            d for d in needed if d == "kb-always" or (d != "kb-never" and rng.random() < hit_rate)
        ]
        while len(retrieved) < 4:
            filler = rng.choice(POOL)
            if filler not in needed and filler not in retrieved:
                retrieved.append(filler)
        rng.shuffle(retrieved)
        topic = rng.choice(sorted(REFERENCES))
        record = make_trace(
            app_name=app,
            reference=REFERENCES[topic],
            reference_context_ids=needed,
            started_at=start - timedelta(seconds=index),
        )
        index_name = "v1-stale" if stale else "v2"
        record.retrieved_contexts = [
            ContextRecord(
                content=f"Article {doc}: how the service works.",
                id=doc,
                score=1.0 - position / 10,
                metadata={"source": rng.choice(["wiki", "faq", "forum"]), "index": index_name},
            )
            for position, doc in enumerate(retrieved)
        ]
        record.release = rng.choice(["2.4.0", "2.4.1"])
        record.environment = "production" if rng.random() < 0.8 else "staging"
        record.tags = ["legacy"] if legacy else [rng.choice(["web", "mobile"])]
        record.user_id = f"user-{rng.randrange(400)}"
        record.metadata = {"topic": topic}
        records.append(record)
    return records


def claims_result(record: TraceRecord, rng: random.Random, *, planted: bool) -> ScoreResult:
    """An ``llm_context_recall`` result shaped as the variant stores it (per-claim verdicts)."""
    claims = []
    for sentence in (record.reference or "").split(". "):
        statement = sentence.strip().rstrip(".") + "."
        miss = 0.9 if planted and statement == WARRANTY else 0.1
        supported = rng.random() >= miss
        claims.append(
            {
                "statement": statement,
                "reason": "The context states it." if supported else "No context mentions it.",
                "attributed": int(supported),
            }
        )
    attributed = sum(c["attributed"] for c in claims)
    return ScoreResult(
        metric=LLM_METRIC,
        value=attributed / len(claims),
        status="scored",
        reason=f"{attributed} of {len(claims)} reference claims can be attributed.",
        details={"claims": claims, "mode": "one_call"},
        model="scripted-judge",
    )


def score_all(
    repo: Repository, records: list[TraceRecord], rng: random.Random, *, planted: bool
) -> int:
    """Store ``records`` and score every due job the way a worker does: the id-based variant
    by the real scorer, ``llm_context_recall`` from scripted verdicts. Returns the results."""
    repo.write_traces(records)
    by_id = {r.trace_id: r for r in records}
    scorer = IDBasedContextRecall()
    stored = 0
    while True:
        jobs = repo.claim_jobs("diagnose-test", limit=5000, lease=timedelta(minutes=5))
        if not jobs:
            return stored
        outcomes: list[tuple[Any, Any]] = []
        for job in jobs:
            record = by_id[job.trace_id]
            if job.metric == ID_METRIC:
                result = scorer.score(
                    reference_context_ids=record.reference_context_ids,
                    retrieved_context_ids=[c.id for c in record.retrieved_contexts],
                )
            else:
                result = claims_result(record, rng, planted=planted)
            outcomes.append((job, result))
        repo.finish_jobs(outcomes)
        stored += len(outcomes)
