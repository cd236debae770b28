"""The catalog of context-recall variants: keys, versions and the inputs each one needs.

Storage gets the job specifications from here through the caller (:func:`job_specs`); the
catalog stays free of heavy imports. Each row's variant lives in
``recalltrace/scorers/variants/<key>.py``: a new variant is its module and its row here. A
variant's ``version`` changes whenever its prompt, parsing or formula changes; stored scores
are keyed by (trace, metric, version).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from recalltrace.storage.contracts import REFERENCE_INPUTS, JobSpec

if TYPE_CHECKING:
    from recalltrace.scorers._prompts import JudgeTask

__all__ = [
    "CATALOG",
    "LLM_METRICS",
    "METRICS_ENV",
    "NON_LLM_METRICS",
    "REFERENCE_INPUTS",
    "MetricInfo",
    "current_versions",
    "job_specs",
    "judge_tasks",
    "metric_info",
    "metrics_from_env",
    "variant_module",
]


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """What the rest of the system needs to know about one variant."""

    key: str
    version: str
    needs: tuple[str, ...]
    uses_llm: bool
    summary: str

    @property
    def needs_reference(self) -> bool:
        """True when some of the needed inputs are ground truth that may arrive late."""
        return any(name in REFERENCE_INPUTS for name in self.needs)

    @property
    def job_spec(self) -> JobSpec:
        """What the job queue needs to know of this variant."""
        return JobSpec(metric=self.key, version=self.version, needs=self.needs)


CATALOG: dict[str, MetricInfo] = {
    info.key: info
    for info in (
        MetricInfo(
            key="llm_context_recall",
            version="1",
            needs=("user_input", "retrieved_contexts", "reference"),
            uses_llm=True,
            summary="Share of the reference's claims that the retrieved contexts support.",
        ),
        MetricInfo(
            key="non_llm_context_recall",
            version="1",
            needs=("retrieved_contexts", "reference_contexts"),
            uses_llm=False,
            summary="Share of reference contexts closely matched by some retrieved context.",
        ),
        MetricInfo(
            key="id_based_context_recall",
            version="1",
            needs=("retrieved_context_ids", "reference_context_ids"),
            uses_llm=False,
            summary="Share of reference document ids that were retrieved.",
        ),
        MetricInfo(
            key="context_entity_recall",
            version="2",
            needs=("reference", "retrieved_contexts"),
            uses_llm=True,
            summary="Share of the reference's entities that appear in the retrieved contexts.",
        ),
        MetricInfo(
            key="chunk_context_recall",
            version="1",
            needs=("user_input", "response", "retrieved_contexts"),
            uses_llm=True,
            summary="Share of relevant retrieved chunks whose key information the answer uses.",
        ),
        MetricInfo(
            key="judge_context_recall",
            version="1",
            needs=("user_input", "response", "reference", "retrieved_contexts"),
            uses_llm=True,
            summary="Holistic judge score of how well the answer matches the reference.",
        ),
        MetricInfo(
            key="pooled_context_recall",
            version="1",
            needs=("user_input", "retrieved_contexts", "pool_contexts"),
            uses_llm=True,
            summary="Share of the relevant documents of pool and retrieval that were retrieved.",
        ),
    )
}

NON_LLM_METRICS: tuple[str, ...] = tuple(k for k, v in CATALOG.items() if not v.uses_llm)
LLM_METRICS: tuple[str, ...] = tuple(k for k, v in CATALOG.items() if v.uses_llm)


def metric_info(key: str) -> MetricInfo:
    """Return the catalog entry of ``key``, or raise ``KeyError`` naming the known keys."""
    try:
        return CATALOG[key]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise KeyError(f"unknown metric {key!r}; known metrics: {known}") from None


def variant_module(key: str) -> ModuleType:
    """The module of variant ``key`` (``recalltrace.scorers.variants.<key>``)."""
    metric_info(key)
    return importlib.import_module(f"recalltrace.scorers.variants.{key}")


def judge_tasks() -> dict[str, JudgeTask]:
    """Every judge task of every LLM variant, by task name (what a test judge answers)."""
    tasks: dict[str, JudgeTask] = {}
    for key in LLM_METRICS:
        for task in variant_module(key).TASKS:
            tasks[task.name] = task
    return tasks


def job_specs() -> list[JobSpec]:
    """The job specification of every variant, in catalog order (handed to storage)."""
    return [info.job_spec for info in CATALOG.values()]


def current_versions() -> dict[str, str]:
    """Every variant's current version (what history reads by default)."""
    return {key: info.version for key, info in CATALOG.items()}


METRICS_ENV = "RECALLTRACE_METRICS"


def metrics_from_env() -> list[str] | None:
    """The variants named by ``$RECALLTRACE_METRICS`` (comma-separated), or ``None``.

    Raises ``ValueError`` naming the unknown key and the known ones.
    """
    raw = os.environ.get(METRICS_ENV, "").strip()
    if not raw:
        return None
    keys = [key.strip() for key in raw.split(",") if key.strip()]
    for key in keys:
        if key not in CATALOG:
            raise ValueError(
                f"{METRICS_ENV} names an unknown metric {key!r}; "
                f"known metrics: {', '.join(CATALOG)}"
            )
    return keys
