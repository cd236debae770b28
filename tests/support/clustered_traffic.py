"""Traffic shaped like real chat traffic for ``scores diagnose``: requests come in sessions and
from repeat users, and the requests of one session or user are easier or harder together.

Each app's requests fall in clusters (users, or sessions without users) of about ``size``
requests; a cluster has its own level of recall, drawn with a standard deviation of ``spread``
around 0.7. A request's recall is the share of four needed documents it retrieved, each at its
cluster's rate. The attributes a diagnosis slices are held by the clusters, as in real traffic:
the release and the client tag (``web``/``mobile``) per session, the environment and one of
``tenants`` tenant tags per user, the document index per request. Without a planted cause
nothing about an attribute changes recall, so any slice named is a false discovery.

Planted causes, when asked: requests tagged ``legacy`` (a share of the sessions) or of release
``2.5.0-bad`` (a share of the sessions) retrieve each needed document ``planted`` less often.

Scores go through the real job queue (claim, finish) of the real repository, as a worker's
would, with the value the request's retrieval gives.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from recalltrace.scorers import ScoreResult
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.storage.repository import Repository
from tests.support.factories import make_trace

METRIC = "id_based_context_recall"
NEEDED = 4


@dataclass(frozen=True)
class Shape:
    """One kind of traffic: who the clusters are, their size and spread."""

    key: str
    """``user`` (users with sessions of about 5 requests) or ``session`` (sessions only)."""
    size: int
    """Requests per cluster, on average."""
    spread: float
    """Standard deviation of the clusters' level of recall."""
    tenants: int = 0
    """Tenant tags, one per user (0: none)."""


def _cluster_sizes(rng: random.Random, count: int, size: int) -> list[int]:
    sizes = []
    left = count
    while left > 0:
        n = max(1, min(left, round(rng.expovariate(1 / size)) or 1))
        sizes.append(n)
        left -= n
    return sizes


def app_traffic(
    rng: random.Random,
    count: int,
    *,
    app: str,
    shape: Shape,
    planted: float = 0.0,
    plant: str = "",
    start: datetime | None = None,
) -> tuple[list[TraceRecord], dict[str, float]]:
    """``count`` requests of ``app`` and each one's recall (by trace id)."""
    start = start or datetime.now(timezone.utc) - timedelta(minutes=5)
    records: list[TraceRecord] = []
    values: dict[str, float] = {}
    index = 0
    for cluster, n in enumerate(_cluster_sizes(rng, count, shape.size)):
        level = min(0.98, max(0.02, rng.gauss(0.7, shape.spread)))
        user = f"{app}-user-{cluster}" if shape.key == "user" else None
        environment = "staging" if rng.random() < 0.2 else "production"
        tenant = f"tenant-{rng.randrange(shape.tenants):02d}" if shape.tenants else None
        # Sessions of about five requests within a user; a session is the cluster otherwise.
        left = n
        session_number = 0
        while left > 0:
            length = min(left, max(1, round(rng.expovariate(1 / 5)))) if user else left
            left -= length
            session = f"{app}-session-{cluster}-{session_number}"
            session_number += 1
            release = "2.5.0-bad" if rng.random() < 0.3 else rng.choice(["2.4.0", "2.4.1"])
            client = "legacy" if rng.random() < 0.15 else rng.choice(["web", "mobile"])
            hit = level
            if planted and (
                (plant == "tag" and client == "legacy")
                or (plant == "release" and release == "2.5.0-bad")
            ):
                hit = max(0.0, level - planted)
            for _ in range(length):
                found = sum(rng.random() < hit for _ in range(NEEDED))
                record = make_trace(
                    app_name=app,
                    reference_context_ids=[f"kb-{i}" for i in range(NEEDED)],
                    started_at=start - timedelta(seconds=index),
                    contexts=1,
                    context_chars=40,
                )
                index += 1
                record.retrieved_contexts = [
                    ContextRecord(
                        content="An article.",
                        id="kb-0",
                        score=1.0,
                        metadata={"index": rng.choice(["v1", "v2"])},
                    )
                ]
                record.release = release
                record.environment = environment
                record.tags = [client] + ([tenant] if tenant else [])
                record.user_id = user
                record.session_id = session
                records.append(record)
                values[record.trace_id] = found / NEEDED
    return records, values


def score_values(repo: Repository, records: list[TraceRecord], values: dict[str, float]) -> int:
    """Store ``records`` and finish each one's job with its recall, through the job queue."""
    repo.write_traces(records)
    stored = 0
    while True:
        jobs = repo.claim_jobs("clustered-test", limit=5000, lease=timedelta(minutes=5))
        if not jobs:
            return stored
        outcomes: list[tuple[Any, Any]] = [
            (
                job,
                ScoreResult(
                    metric=METRIC,
                    value=values[job.trace_id],
                    status="scored",
                    reason="scripted retrieval",
                    details={"found_ids": [], "missing_ids": []},
                    model=None,
                ),
            )
            for job in jobs
        ]
        repo.finish_jobs(outcomes)
        stored += len(outcomes)
