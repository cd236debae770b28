"""Score the labelled traces again with another judge model, to compare judges before
switching: the candidate's scores are set beside the people's labels with the same agreement
figures as the stored judge's, and nothing is stored.

Every labelled trace the candidate could not score (the variant skipped it, or the judge call
failed) is counted with its reason, and the judge's tokens and cost are totalled, so the
comparison says what it rests on and what it cost.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from recalltrace.storage.labels import AgreementPair, LabelStore


@dataclass
class Rescoring:
    """The candidate judge's scores of the labelled traces, as agreement pairs."""

    model: str
    version: str
    pairs: list[AgreementPair] = field(default_factory=list)
    labelled_traces: int = 0
    """Distinct labelled traces in the window."""
    not_scored: Counter[str] = field(default_factory=Counter)
    """Traces the candidate did not score, by status and reason (``"failed: ..."``)."""
    calls_prompt_tokens: int = 0
    calls_completion_tokens: int = 0
    cost_usd: float | None = None
    """Summed over the calls LiteLLM could price; ``None`` when none could be."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the pairs go through the agreement report)."""
        return {
            "model": self.model,
            "version": self.version,
            "labelled_traces": self.labelled_traces,
            "scored": len({p.trace_id for p in self.pairs}),
            "not_scored": dict(self.not_scored),
            "prompt_tokens": self.calls_prompt_tokens,
            "completion_tokens": self.calls_completion_tokens,
            "cost_usd": self.cost_usd,
        }


async def rescore_labelled(
    engine: Engine,
    metric: str,
    judge: Any,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    concurrency: int = 4,
) -> Rescoring:
    """Score every trace labelled for ``metric`` in the window with the judge ``judge`` (a
    :class:`~recalltrace.scorers.JudgeConfig`); nothing is stored."""
    from recalltrace import scorers
    from recalltrace._wiring import repository
    from recalltrace.scorers.catalog import metric_info

    info = metric_info(metric)
    labels = LabelStore(engine).labelled(metric, since=since, until=until)
    outcome = Rescoring(model=judge.model, version=info.version)
    by_trace: dict[str, list[tuple[str, float, str | None]]] = {}
    for trace_id, labeller, value, note in labels:
        by_trace.setdefault(trace_id, []).append((labeller, value, note))
    trace_ids = sorted(by_trace)
    outcome.labelled_traces = len(trace_ids)
    if not trace_ids:
        return outcome
    inputs = repository(engine, metrics=[metric]).load_inputs(trace_ids)
    scorer = scorers.get(metric, judge=scorers.JudgeClient(judge))
    gate = asyncio.Semaphore(concurrency)

    async def one(trace_id: str) -> tuple[str, Any]:
        trace = inputs.get(trace_id)
        if trace is None:
            return trace_id, None
        async with gate:
            try:
                return trace_id, await scorer.ascore(**trace.scorer_inputs())
            except scorers.JudgeError as exc:
                return trace_id, exc
            except scorers.ScorerInputError as exc:
                return trace_id, exc

    results = dict(await asyncio.gather(*(one(t) for t in trace_ids)))
    costs: list[float] = []
    for trace_id in trace_ids:
        result = results[trace_id]
        if result is None:
            outcome.not_scored["skipped: the trace is no longer stored"] += 1
            continue
        if isinstance(result, Exception):
            outcome.not_scored[f"failed: {type(result).__name__}: {result}"] += 1
            continue
        outcome.calls_prompt_tokens += result.prompt_tokens or 0
        outcome.calls_completion_tokens += result.completion_tokens or 0
        if result.cost_usd is not None:
            costs.append(result.cost_usd)
        if result.status != "scored" or result.value is None:
            outcome.not_scored[f"{result.status}: {result.reason}"] += 1
            continue
        for labeller, value, note in by_trace[trace_id]:
            outcome.pairs.append(
                AgreementPair(
                    trace_id=trace_id,
                    labeller=labeller,
                    label=value,
                    note=note,
                    score=float(result.value),
                    reason=result.reason,
                    model=judge.model,
                    version=info.version,
                )
            )
    outcome.cost_usd = sum(costs) if costs else None
    return outcome
