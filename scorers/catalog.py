"""The catalog of context-recall variants: keys, versions and the inputs each one needs.

Imported by storage (to decide which jobs a trace is eligible for) and by the tracer, so it must
stay free of heavy imports. A variant's ``version`` changes whenever its prompt, parsing or
formula changes; stored scores are keyed by (trace, metric, version).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Inputs that can arrive after the trace was stored, through ``tracer.set_reference``.
REFERENCE_INPUTS: frozenset[str] = frozenset(
    {"reference", "reference_contexts", "reference_context_ids"}
)


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
